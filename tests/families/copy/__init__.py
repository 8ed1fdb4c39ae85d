"""A test family: an elementwise copy `y = x` of fp32 tensors, one element (or a few) per
thread. It exists to show the seam: everything a family is lives in this folder, and the tests
register it with `factory.families.register(FAMILY)`; nothing outside the folder and the registry
knows it."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from factory.emit import Emitted
from factory.families import Family, Roofline, Unsupported, io_bytes
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

BLOCKS = (64, 128, 256, 512)
VECS = (1, 2, 4)


@dataclass(frozen=True)
class CopyIR:
    name: str
    x: str
    y: str
    dims: tuple[str, ...]


@dataclass(frozen=True)
class CopySchedule:
    """block: threads per block; vec: consecutive elements each thread copies."""

    family: str = "copy"
    block: int = 128
    vec: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CopySchedule:
        return cls(**d)


def lower(workload) -> CopyIR:
    if len(workload.inputs) != 1 or len(workload.outputs) != 1:
        raise Unsupported("the copy family takes one input and one output")
    x, y = workload.inputs[0], workload.outputs[0]
    if not isinstance(y.expr, E.Input) or y.expr.name != x.name:
        raise Unsupported("the copy family copies: the output must be the input itself")
    if x.dtype != "fp32" or y.dtype != "fp32" or tuple(x.shape) != tuple(y.shape):
        raise Unsupported("the copy family copies fp32 tensors of one shape")
    dims = tuple(d for d in x.shape if isinstance(d, str))
    return CopyIR(workload.name.replace("-", "_"), x.name, y.name, dims)


def space(ir: CopyIR, dims_list) -> list[CopySchedule]:
    return [CopySchedule(block=b, vec=v) for b, v in itertools.product(BLOCKS, VECS)]


def is_valid(ir: CopyIR, s: CopySchedule, dims) -> bool:
    return s.block in BLOCKS and s.vec in VECS


def emit(ir: CopyIR, s: CopySchedule, arch: str = "sm_90") -> Emitted:
    assert is_valid(ir, s, None), s
    entry = f"{ir.name}_copy_b{s.block}v{s.vec}"
    dim_params = "".join(f",\n    .param .u32 p_{d}" for d in ir.dims)
    lines = [
        ".version 8.0",
        f".target {arch}",
        ".address_size 64",
        "",
        f".visible .entry {entry}(",
        f"    .param .u64 p_x,\n    .param .u64 p_y{dim_params}",
        f") .maxntid {s.block}, 1, 1",
        "{",
        "    .reg .pred %p;",
        "    .reg .b32 %r<8>;",
        "    .reg .b64 %rd<8>;",
        "    .reg .f32 %f;",
        "    ld.param.u64 %rd1, [p_x];",
        "    ld.param.u64 %rd2, [p_y];",
        "    mov.u32 %r1, 1;",
    ]
    for d in ir.dims:  # the element count, the product of the dims
        lines += [f"    ld.param.u32 %r2, [p_{d}];", "    mul.lo.u32 %r1, %r1, %r2;"]
    lines += [
        "    mov.u32 %r3, %ctaid.x;",
        "    mov.u32 %r4, %ntid.x;",
        "    mov.u32 %r5, %tid.x;",
        "    mad.lo.u32 %r6, %r3, %r4, %r5;",
        f"    mul.lo.u32 %r6, %r6, {s.vec};",
    ]
    for j in range(s.vec):
        lines += [
            f"    add.u32 %r7, %r6, {j};",
            "    setp.ge.u32 %p, %r7, %r1;",
            f"    @%p bra DONE{j};",
            "    mul.wide.u32 %rd3, %r7, 4;",
            "    add.u64 %rd4, %rd1, %rd3;",
            "    add.u64 %rd5, %rd2, %rd3;",
            "    ld.global.f32 %f, [%rd4];",
            "    st.global.f32 [%rd5], %f;",
            f"DONE{j}:",
        ]
    lines += ["    ret;", "}", ""]
    params = (
        KernelParam("tensor", "u64", ir.x),
        KernelParam("tensor", "u64", ir.y),
        *(KernelParam("dim", "u32", d) for d in ir.dims),
    )
    total = "*".join(ir.dims) or "1"
    grid = f"ceildiv({total}, {s.block * s.vec})"
    return Emitted("\n".join(lines), entry, params, Launch((grid, 1, 1), (s.block, 1, 1)))


def label(schedule: dict) -> str:
    return f"copy: {schedule.get('block')} threads, {schedule.get('vec')} a thread"


def roofline(workload, dims) -> Roofline:
    return Roofline(bytes=io_bytes(workload, dims))


FAMILY = Family(
    name="copy",
    lower=lower,
    space=space,
    is_valid=is_valid,
    emit=emit,
    default_schedule=lambda ir, dims: CopySchedule(),
    schedule_from_dict=CopySchedule.from_dict,
    label=label,
    legend="copy: threads per block and elements per thread.",
    roofline=roofline,
    baselines=("torch_eager",),
    layout_fields=("block", "vec"),
)

MANIFEST = """
name = "plain-copy"
target = "sm_90"

[inputs.x]
shape = ["M", "N"]
dtype = "fp32"

[outputs.y]
expr = "x"
dtype = "fp32"
shape = ["M", "N"]

[[shapes]]
M = 64
N = 1000

[[heldout_shapes]]
M = 3
N = 7
"""
