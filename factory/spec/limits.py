"""Limits on customer input. Every one is checked before work proportional to it is done, so a
hostile manifest costs at most a few milliseconds to refuse."""

MAX_MANIFEST_BYTES = 64 * 1024
MAX_TEXT_CHARS = 4000  # description
MAX_NAME_CHARS = 64
MAX_TAGS = 32

MAX_INPUTS = 16
MAX_OUTPUTS = 8
MAX_LETS = 64
MAX_CONSTANTS = 64
MAX_RANK = 6
MAX_SHAPE_ROWS = 16  # [[shapes]] and [[heldout_shapes]] each

MAX_EXPR_CHARS = 2000
MAX_EXPR_DEPTH = 40  # nesting of one expression's syntax tree
MAX_EXPR_NODES = 400  # syntax-tree nodes in one expression
MAX_GRAPH_DEPTH = 256  # longest operand chain through all lets
MAX_GRAPH_NODES = 4096  # distinct nodes in the whole workload

MAX_CONST_ABS = 1e30  # float32 tops out at 3.4e38; anything near it is a mistake or an attack
MAX_POW_EXPONENT = 16.0

MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**31  # per tensor: 32-bit element indices must stay valid
MAX_TOTAL_BYTES = 64 * 2**30  # inputs + outputs at one shape; an H200 holds 141 GB
# Multiply-adds of the matrix products at one shape (M N K per product, batch included): the
# float64 reference of 2^44 takes on the order of a minute on a 16-core host. The issue's
# largest GEMMs are about 2^40.
MAX_MATMUL_MACS = 2**44

MAX_DIM_EXPR_CHARS = 200
MAX_DIM_EXPR_DEPTH = 16
MAX_DIM_EXPR_ABS = 2**62

MAX_KERNEL_SOURCE_BYTES = 1024 * 1024  # uploaded .ptx or .cu
MAX_PTX_BYTES = 8 * 1024 * 1024  # PTX produced by NVRTC
MAX_KERNEL_PARAMS = 64
NVRTC_TIMEOUT_S = 60.0

# When one evaluation of the reference touches at most this many elements (inputs plus every
# node's result, at the cheapest shape), it is run once at validation time to refuse workloads
# whose reference is NaN or infinite on the declared input ranges. About 50 ms of numpy.
SMOKE_TEST_MAX_ELEMENTS = 1 << 23
