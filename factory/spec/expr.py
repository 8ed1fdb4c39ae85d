"""The parsed form of the operator expression language.

Every node is a frozen dataclass, so structurally equal sub-expressions compare and hash equal:
a `let` binding used twice is the same node twice, and consumers (the float64 reference, the
kernel IR) can share work by keying on nodes. Shapes are symbolic: a tuple whose entries are dim
names (``"M"``) or the literal 1 (a broadcast or kept-reduced axis).

Nodes never hold customer text, only the values parsed out of it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Storage dtypes a tensor may have. Floating point data is computed in float32 on the GPU and in
# float64 in the reference; bf16/fp16 are storage formats.
FLOAT_DTYPES = ("fp32", "bf16", "fp16")
INDEX_DTYPES = ("int32", "int64")
DTYPES = FLOAT_DTYPES + INDEX_DTYPES
# 8-bit floats: an output's storage only (a quantised output), not an input's or a cast's yet.
# fp8e4m3 is OCP E4M3 ("e4m3fn"): 4 exponent bits (bias 7), 3 mantissa bits, no infinities,
# largest finite 448; values round to nearest even and saturate to +-448 (PTX cvt .satfinite).
FP8_DTYPES = ("fp8e4m3",)
OUTPUT_DTYPES = FLOAT_DTYPES + FP8_DTYPES + INDEX_DTYPES
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8e4m3": 1, "int32": 4, "int64": 8}

UNARY_OPS = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs")
BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow")
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
REDUCE_OPS = ("sum", "mean", "max", "min")
# Reductions the language has beyond REDUCE_OPS (the row family lowers REDUCE_OPS only).
EXTRA_REDUCE_OPS = ("prod",)
SCAN_OPS = ("sum", "prod")  # cumsum, cumprod
ARG_OPS = ("argmax", "argmin")
POOL_OPS = ("max", "avg")  # maxpool, avgpool

Dim = str | int  # a dim symbol such as "M", or 1
Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class Node:
    """Base of all expression nodes. `shape` is symbolic; `dtype` is the value's type
    ("fp32" for every floating intermediate, an index dtype for index tensors, "bool" for
    comparisons)."""


@dataclass(frozen=True)
class Input(Node):
    name: str
    shape: Shape
    dtype: str


@dataclass(frozen=True)
class Const(Node):
    value: float
    shape: Shape = ()
    dtype: str = "fp32"


@dataclass(frozen=True)
class Unary(Node):
    op: str
    x: Node
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Binary(Node):
    op: str  # for "pow", b is always a Const
    a: Node
    b: Node
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Compare(Node):
    op: str
    a: Node
    b: Node
    shape: Shape
    dtype: str = "bool"


@dataclass(frozen=True)
class Where(Node):
    cond: Node
    a: Node
    b: Node
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Reduce(Node):
    op: str
    x: Node
    axis: int  # normalised to a non-negative axis of x
    keepdims: bool
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Gather(Node):
    """x[..., idx[...]] along the last axis of x: x has shape (*B, N), idx has shape (*B,) or
    (*B, 1) (the result has idx's shape). Index values outside [0, N) are a workload error."""

    x: Node
    idx: Node
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Cast(Node):
    """Round x to `to` (a storage dtype) and continue in float32: bf16(x) models a bf16 store."""

    x: Node
    to: str
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Transpose(Node):
    """x with its last two axes swapped (`w.T` of a 2-D tensor): a view, no arithmetic. In a
    matmul it says the operand is stored the other way round (a weight stored [N, K])."""

    x: Node
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class MatMul(Node):
    """a @ b over the last two axes: a (*Ba, M, K), b (*Bb, K, N) -> (*broadcast(Ba, Bb), M, N),
    products summed over K (in float64 in the reference, fp32 on the tensor cores)."""

    a: Node
    b: Node
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Scan(Node):
    """A cumulative sum or product along `axis` (cumsum/cumprod): element i combines elements
    0..i (exclusive: 0..i-1, the first is the identity; reverse: i..n-1, or i+1..n-1)."""

    op: str  # "sum" or "prod"
    x: Node
    axis: int  # normalised to a non-negative axis of x
    exclusive: bool
    reverse: bool
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class ArgReduce(Node):
    """The index of the largest (argmax) or smallest (argmin) element along `axis`, the first
    one on ties, as numpy. An index value: an output of it is declared int32 or int64."""

    op: str  # "argmax" or "argmin"
    x: Node
    axis: int
    keepdims: bool
    shape: Shape
    dtype: str = "int64"


@dataclass(frozen=True)
class Pool(Node):
    """maxpool/avgpool over the trailing len(window) axes of x: windows of `window` elements
    every `stride`, the axis padded by `padding` on both sides (-inf for max; zeros, counted,
    for avg: torch's count_include_pad). A pooled axis of size L becomes
    (L + 2 * padding - window) // stride + 1: a derived dim named `pooled_dim_name(...)`
    (factory.spec.manifest adds its size to every shape row), or the number for a literal L."""

    op: str  # "max" or "avg"
    x: Node
    window: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    shape: Shape
    dtype: str = "fp32"


@dataclass(frozen=True)
class Attention(Node):
    """Scaled dot-product attention (factory.spec.attention): q (B, Hq, S, D), k and v
    (B, Hkv, Skv, D), Hq a multiple of Hkv (query head h reads key/value head h // (Hq / Hkv)).
    The score of query i and key j is `score` evaluated with s = scale * q[i] . k[j] (None: s
    itself), keys where any `mask` term is false take no weight, and the softmax over the keys
    weighs v. `part` "out" is that (B, Hq, S, D) result (zero for a row with no key left),
    "lse" the (B, Hq, S) log-sum-exp of the kept scores (natural log; -inf for such a row).
    `score` and `mask` are over the placeholders s, i, j, h (Inputs of shape ()) and `extra`,
    the per-head or per-position inputs they read by subscript (Gather nodes); only q, k, v and
    `extra` are operands of the node."""

    q: Node
    k: Node
    v: Node
    extra: tuple[Node, ...]
    score: Node | None
    mask: tuple[Node, ...]
    scale: float
    part: str
    shape: Shape
    dtype: str = "fp32"


def pooled_size(n: int, window: int, stride: int, padding: int) -> int:
    return (n + 2 * padding - window) // stride + 1


def pooled_dim_name(dim: str, window: int, stride: int, padding: int) -> str:
    """The derived dim of a pooled axis: W pooled by 3, stride 2, padding 1 is "W_3_2_1"."""
    return f"{dim}_{window}_{stride}_{padding}"


def children(node: Node) -> tuple[Node, ...]:
    """The direct operands of a node, in a fixed order."""
    if isinstance(node, Input | Const):
        return ()
    if isinstance(node, Unary | Reduce | Cast | Transpose | Scan | ArgReduce | Pool):
        return (node.x,)
    if isinstance(node, Binary | Compare | MatMul):
        return (node.a, node.b)
    if isinstance(node, Where):
        return (node.cond, node.a, node.b)
    if isinstance(node, Gather):
        return (node.x, node.idx)
    if isinstance(node, Attention):
        return (node.q, node.k, node.v, *node.extra)
    raise TypeError(f"not an expression node: {type(node).__name__}")


def walk(node: Node) -> list[Node]:
    """Every distinct node reachable from `node`, operands before users (a topological order)."""
    seen: set[Node] = set()
    order: list[Node] = []
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            if n not in seen:
                seen.add(n)
                order.append(n)
            continue
        if n in seen:
            continue
        stack.append((n, True))
        for c in reversed(children(n)):
            if c not in seen:
                stack.append((c, False))
    return order


# Hashing and equality: dataclass methods recurse through every operand on every call, and `let`
# bindings make the node graph a DAG whose tree expansion can be exponential in its size
# (`a2 = a1 + a1`, `a3 = a2 + a2`, ...). So each node remembers its hash after the first call, and
# equality walks the two graphs once, remembering the pairs already found equal. The cached hash
# lives in the instance's __dict__ (not a field: repr and asdict ignore it) and is dropped when
# pickling, because str hashes differ between processes. Semantics are unchanged: structural.
def _fields_of(node: Node) -> tuple:
    return tuple(getattr(node, f) for f in node.__dataclass_fields__)


def _graphs_equal(a: Node, b: Node) -> bool:
    done: set[tuple[int, int]] = set()
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y or (id(x), id(y)) in done:
            continue
        if x.__class__ is not y.__class__ or hash(x) != hash(y):
            return False
        for fx, fy in zip(_fields_of(x), _fields_of(y), strict=True):
            if isinstance(fx, Node):
                if not isinstance(fy, Node):
                    return False
                stack.append((fx, fy))
            elif fx != fy:
                return False
        done.add((id(x), id(y)))
    return True


def _install_graph_methods(cls: type) -> None:
    structural_hash = cls.__hash__

    def __hash__(self) -> int:  # noqa: N807
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = structural_hash(self)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:  # noqa: N807
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _graphs_equal(self, other)

    cls.__hash__ = __hash__
    cls.__eq__ = __eq__


def _getstate(self: Node) -> dict:
    state = dict(self.__dict__)
    state.pop("_hash", None)
    return state


Node.__getstate__ = _getstate
for _cls in (Input, Const, Unary, Binary, Compare, Where, Reduce, Gather, Cast, Transpose, MatMul):
    _install_graph_methods(_cls)
for _cls in (Scan, ArgReduce, Pool, Attention):
    _install_graph_methods(_cls)
del _cls
