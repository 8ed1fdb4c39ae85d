"""The whole-tensor reduction family: sum/mean/max/min/prod over every axis of an elementwise
expression (a mean loss, a whole-tensor norm), to one number per output, in one kernel.

Deterministic in one launch without a workspace in the batch format. Two ways, a schedule
field (`combine`):

- "cluster": one thread-block cluster of `blocks` (<= 8, portable) blocks walks the tensor;
  block partials meet through distributed shared memory in rank order. Verified on the CPU
  (factory.ptxsim); bounded by the cluster's few SMs, so for small tensors.
- "ticket": a persistent grid of up to `blocks` blocks; each writes its partial to a workspace
  the kernel itself owns (a module-scope `.global` array in the PTX: device memory allocated
  and zeroed when the module loads, so no batch field is needed), then takes a ticket from a
  module-scope counter (atom.add after a release fence); the block that takes the last ticket
  combines every partial in block order (fixed, so the bits never depend on which block came
  last), writes the result and resets the counter for the next launch. Two launches of one
  loaded module must not overlap (the GPU worker runs a candidate's launches on one stream,
  one after another). factory.ptxsim models neither atomics nor module-scope memory; the test
  tests/factory/test_fam_workspace_paths.py supplies both and runs this path twice on one
  memory (blocks one at a time, in order: the memory ordering itself waits for the GPU,
  lab/memfamilies/bench.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.emit import Emitted
from factory.emit.module import module_text
from factory.emit.ptx import Builder, f32_literal
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.colreduce import ELEMENTWISE, OutputPlan, reduce_chain
from factory.families.colreduce.kernel import ESIZE, IDENTITY, ColumnKernel, ident
from factory.families.common import ScheduleDict, checked_emit
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

ARCHS = ("sm_90", "sm_100")
THREADS = (128, 256, 512, 1024)
CLUSTER_BLOCKS = (1, 2, 4, 8)
TICKET_BLOCKS = (132, 264, 528, 1056)
UNROLLS = (1, 2, 4)


@dataclass(frozen=True)
class AllReduceIR:
    name: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[OutputPlan, ...]
    order: tuple[E.Node, ...]
    shape: tuple
    dims: tuple[str, ...]

    @property
    def max_esize(self) -> int:
        return max(E.DTYPE_BYTES[d] for _, d in self.inputs)


def lower(workload) -> AllReduceIR:
    plans, shape = [], None
    for o in workload.outputs:
        op, operand, axes = reduce_chain(o.expr)
        if op not in E.REDUCE_OPS + E.EXTRA_REDUCE_OPS:
            raise Unsupported(f"reduction {op} is not supported")
        if o.dtype not in E.FLOAT_DTYPES:
            raise Unsupported(f"output {o.name} is {o.dtype}")
        if axes != tuple(range(len(operand.shape))):
            raise Unsupported("not a reduction over every axis (the whole tensor)")
        if shape is not None and operand.shape != shape:
            raise Unsupported("outputs reduce operands of different shapes")
        shape = operand.shape
        plans.append(OutputPlan(o.name, o.dtype, op, operand))
    order, seen, inputs = [], set(), {}
    for p in plans:
        for n in E.walk(p.operand):
            if n in seen:
                continue
            seen.add(n)
            order.append(n)
            if not isinstance(n, ELEMENTWISE):
                raise Unsupported(f"{type(n).__name__} inside a whole-tensor reduction's operand")
            if isinstance(n, E.Input):
                if n.dtype not in E.FLOAT_DTYPES or n.shape != shape:
                    raise Unsupported(f"input {n.name}: only float inputs of the operand's shape")
                inputs[n.name] = n.dtype
            if isinstance(n, E.Binary) and n.op == "pow" and not isinstance(n.b, E.Const):
                raise Unsupported("pow needs a constant exponent")
            if isinstance(n, E.Cast) and n.to not in E.FLOAT_DTYPES:
                raise Unsupported(f"cast to {n.to}")
            if n.shape not in ((), shape) and not isinstance(n, E.Const):
                raise Unsupported(f"{type(n).__name__} of shape {n.shape} is broadcast")
    if not inputs:
        raise Unsupported("the operand reads no input")
    return AllReduceIR(
        name=workload.name.replace("-", "_"),
        inputs=tuple(inputs.items()),
        outputs=tuple(plans),
        order=tuple(order),
        shape=shape,
        dims=tuple(dict.fromkeys(d for d in shape if isinstance(d, str))),
    )


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads per block; vec: adjacent elements a load (16 bytes at most); combine: "cluster"
    or "ticket" (module docstring); blocks: the cluster's size, or the persistent grid's
    largest size; unroll: vectors a thread has in flight."""

    family: str = "allreduce"
    threads: int = 512
    vec: int = 4
    combine: str = "ticket"
    blocks: int = 264
    unroll: int = 2

    def tag(self) -> str:
        return f"t{self.threads}v{self.vec}{self.combine[0]}{self.blocks}u{self.unroll}"


def vecs(ir) -> tuple[int, ...]:
    return tuple(v for v in (1, 2, 4, 8) if v * ir.max_esize <= 16)


def _size(shape, dims) -> int:
    return math.prod(int(dims[d]) if isinstance(d, str) else int(d) for d in shape)


def is_valid(ir: AllReduceIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "allreduce":
        return False, "not an allreduce schedule"
    if s.threads not in THREADS or s.vec not in vecs(ir) or s.unroll not in UNROLLS:
        return False, "threads/vec/unroll outside the space"
    if s.combine == "cluster":
        if s.blocks not in CLUSTER_BLOCKS:
            return False, f"a cluster of {s.blocks} blocks (portable: at most 8)"
    elif s.combine == "ticket":
        if s.blocks not in TICKET_BLOCKS:
            return False, f"a persistent grid of {s.blocks} blocks is outside the space"
    else:
        return False, f"unknown combine {s.combine!r}"
    if s.vec * s.unroll * len(ir.inputs) > 64 or s.vec * len(ir.outputs) > 32:
        return False, "too many registers a thread"
    if dims is not None:
        n = _size(ir.shape, dims)
        if s.combine == "ticket" and n < s.threads * s.vec * 4:
            return False, f"{n} elements: one cluster does it without a ticket"
        if s.combine == "cluster" and s.blocks > 1 and n < s.blocks * s.threads * s.vec:
            return False, f"{n} elements for {s.blocks} blocks of {s.threads} x {s.vec}"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    out = []
    for t, v, u in itertools.product(THREADS, vecs(ir), UNROLLS):
        for combine, counts in (("cluster", CLUSTER_BLOCKS), ("ticket", TICKET_BLOCKS)):
            for nb in counts:
                s = Schedule(threads=t, vec=v, combine=combine, blocks=nb, unroll=u)
                if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
                    out.append(s)
    return out


def default_schedule(ir, dims) -> Schedule:
    v = max(vecs(ir))
    n = _size(ir.shape, dims)
    if n >= 1 << 20:
        return Schedule(threads=512, vec=v, combine="ticket", blocks=264, unroll=2)
    for nb in reversed(CLUSTER_BLOCKS):
        for t in (256, 128):
            s = Schedule(threads=t, vec=v, combine="cluster", blocks=nb, unroll=1)
            if is_valid(ir, s, dims)[0]:
                return s
    return Schedule(threads=128, vec=1, combine="cluster", blocks=1, unroll=1)


def seeds(ir, dims) -> list[Schedule]:
    d = default_schedule(ir, dims)
    out = [d]
    for change in ({"unroll": 4}, {"blocks": 528}, {"blocks": 1056}, {"threads": 256},
                   {"unroll": 1}, {"combine": "cluster", "blocks": 8}):  # fmt: skip
        s = Schedule(**{**d.to_dict(), **change})
        if s not in out and is_valid(ir, s, dims)[0]:
            out.append(s)
    return out


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return [
        log2(elements),
        log2(s.blocks),
        float(s.combine == "ticket"),
        log2(s.threads),
        float(s.vec * 4),
        float(s.unroll),
    ]


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    how = "cluster" if s.combine == "cluster" else "grid, last block combines"
    return f"whole tensor: {s.blocks} blocks ({how}) x {s.threads} threads x {s.vec} a load"


# -- the emitter ---------------------------------------------------------------------------------


class WholeKernel(ColumnKernel):
    """Grid-stride over the flat tensor, then warp butterflies, warps through shared memory,
    and the blocks through the cluster or the ticket (module docstring)."""

    def __init__(self, ir, s, arch):
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.V, self.U = s.vec, s.unroll
        self.nout = len(ir.outputs)
        self.W = s.threads // 32

    def block_reduce(self, vals: list[str], tid: str, lane: str, warp: str, slot0: int) -> None:
        """vals (one per output) -> thread 0 holds the block's combination, in fixed order."""
        b, ir = self.b, self.ir
        for off in (16, 8, 4, 2, 1):
            for o, a in zip(ir.outputs, vals, strict=True):
                t = b.reg("f32")
                b.op(f"shfl.sync.bfly.b32 {t}, {a}, {off}, 31, -1")
                self.combine(a, t, o.op)
        smem = self.u32("red_smem")
        lp = b.reg("pred")
        b.op(f"setp.eq.u32 {lp}, {lane}, 0")
        at = b.reg("b32")
        b.op(f"mad.lo.u32 {at}, {warp}, {4 * self.nout}, {smem}")
        for k, a in enumerate(vals):
            b.op(f"@{lp} st.shared.f32 [{at}+{4 * (slot0 + k)}], {a}")
        b.op("bar.sync 0")
        t0 = b.reg("pred")
        b.op(f"setp.eq.u32 {t0}, {tid}, 0")
        skip = b.new_label("warps_met")
        b.op(f"@!{t0} bra {skip}")
        for w in range(1, self.W):
            for k, (o, a) in enumerate(zip(ir.outputs, vals, strict=True)):
                t = b.reg("f32")
                b.op(f"ld.shared.f32 {t}, [{smem}+{4 * (slot0 + w * self.nout + k)}]")
                self.combine(a, t, o.op)
        b.label(skip)
        b.op("bar.sync 0")

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        ir, s, b = self.ir, self.s, self.b
        V, T = self.V, s.threads
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", o.name) for o in ir.outputs]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        N = self.product(ir.shape)
        base = {}
        for name, _ in ir.inputs:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            base[name] = r
        obase = []
        for o in ir.outputs:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(o.name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            obase.append(r)
        tid, blk, nblk = self.u32("%tid.x"), self.u32("%ctaid.x"), self.u32("%nctaid.x")
        lane, warp = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {lane}, {tid}, 31")
        b.op(f"shr.u32 {warp}, {tid}, 5")
        i = b.reg("b32")
        b.op(f"mad.lo.u32 {i}, {blk}, {T}, {tid}")
        b.op(f"mul.lo.u32 {i}, {i}, {V}")
        step = b.reg("b32")
        b.op(f"mul.lo.u32 {step}, {nblk}, {T * V}")
        accs = [[b.reg("f32") for _ in range(V)] for _ in ir.outputs]
        for o, row in zip(ir.outputs, accs, strict=True):
            for a in row:
                b.op(f"mov.f32 {a}, {f32_literal(IDENTITY[o.op])}")
        nmod = b.reg("b32")
        b.op(f"and.b32 {nmod}, {N}, {V - 1}")
        aligned = b.reg("pred")
        b.op(f"setp.eq.u32 {aligned}, {nmod}, 0")
        tail = b.new_label("tail")
        b.op(f"@!{aligned} bra {tail}")
        for width in [self.U, 1] if self.U > 1 else [1]:  # whole vectors, `width` in flight
            top, end = b.new_label("vec"), b.new_label("vec_end")
            b.label(top)
            last = b.reg("b32")
            b.op(f"mad.lo.u32 {last}, {step}, {width - 1}, {i}")
            b.op(f"add.u32 {last}, {last}, {V}")
            pe = b.reg("pred")
            b.op(f"setp.gt.u32 {pe}, {last}, {N}")
            b.op(f"@{pe} bra.uni {end}")
            rows = []
            for u in range(width):
                iu = b.reg("b32")
                b.op(f"mad.lo.u32 {iu}, {step}, {u}, {i}")
                per = {}
                for name, dtype in ir.inputs:
                    addr = b.reg("b64")
                    b.op(f"mul.wide.u32 {addr}, {iu}, {ESIZE[dtype]}")
                    b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                    per[name] = self.load_vector(addr, dtype)
                rows.append(per)
            for per in rows:
                for j in range(V):
                    vals = self.evaluate({name: per[name][j] for name, _ in ir.inputs})
                    for o, row, v in zip(ir.outputs, accs, vals, strict=True):
                        self.combine(row[j], v, o.op)
            b.op(f"mad.lo.u32 {i}, {step}, {width}, {i}")
            b.op(f"bra.uni {top}")
            b.label(end)
        b.label(tail)  # what is left: elements, each under its predicate
        top, end = b.new_label("elems"), b.new_label("elems_end")
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {i}, {N}")
        b.op(f"@{pe} bra.uni {end}")
        per = {name: [] for name, _ in ir.inputs}
        for j in range(V):
            ij, pj = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {ij}, {i}, {j}")
            b.op(f"setp.lt.u32 {pj}, {ij}, {N}")
            for name, dtype in ir.inputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {ij}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                per[name].append(self.load_scalar(addr, dtype, pj))
            vals = self.evaluate({name: per[name][j] for name, _ in ir.inputs})
            for o, row, v in zip(ir.outputs, accs, vals, strict=True):
                t = b.reg("f32")
                b.op(f"selp.f32 {t}, {v}, {f32_literal(IDENTITY[o.op])}, {pj}")
                self.combine(row[j], t, o.op)
        b.op(f"add.u32 {i}, {i}, {step}")
        b.op(f"bra.uni {top}")
        b.label(end)
        vals = []
        for o, row in zip(ir.outputs, accs, strict=True):
            for a in row[1:]:
                self.combine(row[0], a, o.op)
            vals.append(row[0])
        self.block_reduce(vals, tid, lane, warp, 0)
        t0 = b.reg("pred")
        b.op(f"setp.eq.u32 {t0}, {tid}, 0")
        top_slot = self.W * self.nout  # after the warps' slots
        globals_ = []
        if s.combine == "cluster" and s.blocks > 1:
            smem = self.u32("red_smem")
            for k, a in enumerate(vals):
                b.op(f"@{t0} st.shared.f32 [{smem}+{4 * (top_slot + k)}], {a}")
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
            rank = self.u32("%cluster_ctarank")
            writer = b.reg("pred")
            b.op(f"setp.eq.u32 {writer}, {rank}, 0")
            b.op(f"and.pred {writer}, {writer}, {t0}")
            skip = b.new_label("gathered")
            b.op(f"@!{writer} bra {skip}")
            for k_rank in range(1, s.blocks):
                remote = b.reg("b32")
                b.op(f"mapa.shared::cluster.u32 {remote}, {smem}, {k_rank}")
                for k, (o, a) in enumerate(zip(ir.outputs, vals, strict=True)):
                    t = b.reg("f32")
                    b.op(f"ld.shared::cluster.f32 {t}, [{remote}+{4 * (top_slot + k)}]")
                    self.combine(a, t, o.op)
            b.label(skip)
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
        elif s.combine == "ticket":
            part, ticket = f"{ident(ir.name)}_part", f"{ident(ir.name)}_ticket"
            globals_ = [
                f".global .align 16 .f32 {part}[{s.blocks * self.nout}];",
                f".global .align 4 .u32 {ticket};",
            ]
            pbase, tk = b.reg("b64"), b.reg("b64")
            b.op(f"mov.u64 {pbase}, {part}")
            b.op(f"mov.u64 {tk}, {ticket}")
            smem = self.u32("red_smem")
            mine = b.reg("b64")
            b.op(f"mul.wide.u32 {mine}, {blk}, {4 * self.nout}")
            b.op(f"add.u64 {mine}, {mine}, {pbase}")
            took = b.new_label("took")
            islast = b.reg("b32")
            b.op(f"mov.u32 {islast}, 0")
            b.op(f"@!{t0} bra {took}")
            for k, a in enumerate(vals):
                b.op(f"st.global.f32 [{mine}+{4 * k}], {a}")
            old = b.reg("b32")
            b.op("fence.acq_rel.gpu")
            b.op(f"atom.acq_rel.gpu.global.add.u32 {old}, [{tk}], 1")
            nm1 = b.reg("b32")
            b.op(f"sub.u32 {nm1}, {nblk}, 1")
            pl = b.reg("pred")
            b.op(f"setp.eq.u32 {pl}, {old}, {nm1}")
            b.op(f"selp.u32 {islast}, 1, 0, {pl}")
            b.op(f"st.shared.u32 [{smem}+{4 * top_slot}], {islast}")
            b.label(took)
            b.op("bar.sync 0")
            b.op(f"ld.shared.u32 {islast}, [{smem}+{4 * top_slot}]")
            done = b.new_label("done")
            pz = b.reg("pred")
            b.op(f"setp.eq.u32 {pz}, {islast}, 0")
            b.op(f"@{pz} bra.uni {done}")
            b.op("fence.acq_rel.gpu")
            # the last block: every partial, thread t taking blocks t, t + T, ... in order
            for o, a in zip(ir.outputs, vals, strict=True):
                b.op(f"mov.f32 {a}, {f32_literal(IDENTITY[o.op])}")
            j = b.reg("b32")
            b.op(f"mov.u32 {j}, {tid}")
            top, end = b.new_label("parts"), b.new_label("parts_end")
            b.label(top)
            pj = b.reg("pred")
            b.op(f"setp.ge.u32 {pj}, {j}, {nblk}")
            b.op(f"@{pj} bra.uni {end}")
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {j}, {4 * self.nout}")
            b.op(f"add.u64 {addr}, {addr}, {pbase}")
            for k, (o, a) in enumerate(zip(ir.outputs, vals, strict=True)):
                t = b.reg("f32")
                b.op(f"ld.relaxed.gpu.global.f32 {t}, [{addr}+{4 * k}]")
                self.combine(a, t, o.op)
            b.op(f"add.u32 {j}, {j}, {T}")
            b.op(f"bra.uni {top}")
            b.label(end)
            self.block_reduce(vals, tid, lane, warp, 0)
            b.op(f"@{t0} st.global.u32 [{tk}], 0")  # the next launch starts from ticket 0
            writer = t0
            self._done = done
        else:
            writer = t0
        stored = b.new_label("stored")
        b.op(f"@!{writer} bra {stored}")
        nf = b.reg("f32")
        b.op(f"cvt.rn.f32.u32 {nf}, {N}")
        for o, a, ob in zip(ir.outputs, vals, obase, strict=True):
            v = a
            if o.op == "mean":
                v = b.reg("f32")
                b.op(f"div.rn.f32 {v}, {a}, {nf}")
            if o.dtype == "fp32":
                b.op(f"st.global.f32 [{ob}], {v}")
            else:
                h = b.reg("b16")
                b.op(f"cvt.rn.{'bf16' if o.dtype == 'bf16' else 'f16'}.f32 {h}, {v}")
                b.op(f"st.global.b16 [{ob}], {h}")
        b.label(stored)
        if s.combine == "ticket":
            b.label(self._done)
        b.op("ret")

        entry = f"{ident(ir.name)}_allreduce_{s.tag()}"
        words = self.W * self.nout + max(self.nout, 1)
        cluster = s.combine == "cluster" and s.blocks > 1
        body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{words}];"]
        ptx = module_text(
            family="allreduce", workload=ir.name, schedule=s.to_dict(), arch=self.arch,
            entry=entry, params=params, threads=T, body=body, lines=b.lines, globals_=globals_,
            cluster=s.blocks if cluster else 1,
        )  # fmt: skip
        if s.combine == "cluster":
            grid: int | str = s.blocks
        else:
            n_text = "(" + "*".join(str(d) for d in ir.shape) + ")" if ir.shape else "1"
            grid = f"min({s.blocks}, ceildiv({n_text}, {T * V}))"
        launch = Launch((grid, 1, 1), (T, 1, 1), cluster=(s.blocks, 1, 1) if cluster else None)
        return Emitted(ptx, entry, tuple(params), launch)


def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
    def render(ir, s, arch):
        return WholeKernel(ir, s, arch).render()

    return checked_emit("allreduce", ARCHS, Schedule, is_valid, render, ir, schedule, arch)


def roofline(workload, dims) -> Roofline:
    return Roofline(bytes=io_bytes(workload, dims))


FAMILY = Family(
    name="allreduce",
    lower=lower,
    space=space,
    is_valid=is_valid,
    emit=emit,
    default_schedule=default_schedule,
    seeds=seeds,
    fits=lambda ir, s, dims_list: all(is_valid(ir, s, d)[0] for d in dims_list),
    space_fits=True,
    schedule_from_dict=Schedule.from_dict,
    label=label,
    legend="whole tensor: blocks (a cluster's, or the persistent grid's with the last block "
    "combining) x threads x elements a load",
    features=features,
    feature_fields=("threads", "vec", "combine", "blocks", "unroll"),
    roofline=roofline,
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.colreduce.baselines",
    layout_fields=("combine", "blocks", "threads"),
    scalar_access_note=lambda schedule: (
        "a block's partials, one word an output, stored once a block for the last block"
        if schedule.get("combine") == "ticket"
        else None
    ),
)

__all__ = ["FAMILY", "AllReduceIR", "Schedule", "WholeKernel", "lower"]
