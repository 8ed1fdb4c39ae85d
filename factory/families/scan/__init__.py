"""The scan family: cumsum/cumprod along any axis (inclusive or exclusive, forward or reverse)
of an elementwise expression of inputs of the output's shape. Along the last axis, one row a
block (or, for few long rows, tiles over many blocks: "lookback"); along a leading or middle
axis ("columns"), the (P, R, Q) view of the column family: a thread owns vec adjacent columns and
walks R, a cluster of blocks splitting R into contiguous parts whose totals go first.

A block of `threads` walks its row in chunks of threads x vec elements: each thread scans its
vec elements in registers, the warp's lanes scan their totals with a butterfly (shfl.bfly: each
lane ends with the combination of the lanes before it and the warp's total), the warps' totals
meet in shared memory, and a running carry takes each chunk's total into the next. Reverse
scans walk the row from its end. Every combination is in a fixed order: the same bits each run.

Few very long rows: one block a row would leave SMs idle, so a row's tiles go to many blocks
in the order of a ticket; each publishes its aggregate and folds the aggregates of the tiles
before it in a fixed order (a decoupled look-back that never uses a predecessor's inclusive
prefix, whose bits would depend on timing), in a workspace the PTX module declares itself."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.emit import Emitted
from factory.emit.module import module_text
from factory.emit.ptx import Builder, f32_literal
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.colreduce import operand_inputs
from factory.families.colreduce.kernel import (
    COMBINE,
    ESIZE,
    IDENTITY,
    ColumnKernel,
    ident,
)
from factory.families.common import ScheduleDict, checked_emit
from factory.families.scan.columns import render_rounds, smem_words
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

ARCHS = ("sm_90", "sm_100")
THREADS = (32, 64, 128, 256, 512, 1024)
MODES = ("row", "lookback", "columns", "warp")
SPLITS = (1, 2, 4, 8)
CHUNKS = (1, 2, 4, 8)
LANES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
ROWS = (1, 2, 4, 8, 16)
SMEM_BYTES = 48 * 1024
LOOKBACK_TILES = 1 << 16  # the module's workspace: an aggregate and a flag per tile of a launch
SMS = 132
LINE_BYTES = 128  # an L2 line: the least a thread row of a column strip reads of a row


@dataclass(frozen=True)
class ScanPlan:
    name: str
    dtype: str
    op: str  # "sum" / "prod"
    operand: E.Node


@dataclass(frozen=True)
class ScanIR:
    name: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[ScanPlan, ...]  # one
    order: tuple[E.Node, ...]
    shape: tuple
    exclusive: bool
    reverse: bool
    dims: tuple[str, ...]
    axis: int = -1  # the scanned axis, non-negative; the last: rows, else columns

    @property
    def max_esize(self) -> int:
        return max(E.DTYPE_BYTES[d] for _, d in self.inputs)

    @property
    def columns(self) -> bool:
        return self.axis != len(self.shape) - 1


def lower(workload) -> ScanIR:
    if len(workload.outputs) != 1:
        raise Unsupported("the scan family writes one output")
    o = workload.outputs[0]
    n = o.expr
    if not isinstance(n, E.Scan):
        raise Unsupported("an output that is not a scan (cumsum/cumprod)")
    if o.dtype not in E.FLOAT_DTYPES:
        raise Unsupported(f"output {o.name} is {o.dtype}")
    order, inputs = operand_inputs(
        n.x, n.shape, inside="a scan's operand", of_shape="the output's shape"
    )
    if not inputs:
        raise Unsupported("the scan reads no input")
    return ScanIR(
        name=workload.name.replace("-", "_"),
        inputs=tuple(inputs.items()),
        outputs=(ScanPlan(o.name, o.dtype, n.op, n.x),),
        order=tuple(order),
        shape=n.shape,
        exclusive=n.exclusive,
        reverse=n.reverse,
        dims=tuple(dict.fromkeys(d for d in n.shape if isinstance(d, str))),
        axis=n.axis,
    )


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads: a block; vec: adjacent elements a thread scans in registers a chunk; mode:
    "row" (a row a block, chunk after chunk) or "lookback" (a row's tiles of chunks x threads
    x vec elements over many blocks, each waiting for the aggregates of the tiles before it)
    or "columns" (a leading or middle axis: factory.families.scan.columns); chunks: chunks a
    lookback tile (held in registers between its two passes). Columns only: lanes (threads
    along the contiguous axis), rows (rows a thread holds in registers a round) and split
    (blocks of a cluster sharing a strip of columns)."""

    family: str = "scan"
    threads: int = 256
    vec: int = 4
    mode: str = "row"
    chunks: int = 1
    split: int = 1
    lanes: int = 32
    rows: int = 1
    ahead: int = 0  # columns: the next round's loads issued before this round's barriers

    def tag(self) -> str:
        if self.mode == "columns":
            tail = "a" if self.ahead else ""
            return f"t{self.threads}v{self.vec}l{self.lanes}k{self.rows}c{self.split}{tail}"
        if self.mode == "lookback":
            return f"t{self.threads}v{self.vec}lb{self.chunks}"
        if self.mode == "warp":
            return f"t{self.threads}v{self.vec}w{self.chunks}"
        return f"t{self.threads}v{self.vec}"

    @property
    def tile(self) -> int:
        return self.chunks * self.threads * self.vec


def vecs(ir) -> tuple[int, ...]:
    return tuple(v for v in (1, 2, 4, 8) if v * ir.max_esize <= 16)


def _row(ir, dims) -> int:
    """The scanned axis's length."""
    d = ir.shape[ir.axis]
    return int(dims[d]) if isinstance(d, str) else int(d)


def is_valid(ir: ScanIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "scan" or s.threads not in THREADS or s.vec not in vecs(ir):
        return False, "threads/vec outside the space"
    if s.mode not in MODES or s.chunks not in CHUNKS:
        return False, "mode/chunks outside the space"
    if s.mode not in ("lookback", "warp") and s.chunks != 1:
        return False, "chunks are a lookback tile's or a warp row's"
    if (s.mode == "columns") != ir.columns:
        return False, "columns scan a leading or middle axis; rows and lookback the last"
    if s.split not in SPLITS or (s.mode != "columns" and s.split != 1):
        return False, "a split is a columns layout's cluster"
    if s.mode != "columns" and (s.lanes != 32 or s.rows != 1 or s.ahead):
        return False, "lanes, rows and ahead are a columns layout's"
    if s.ahead not in (0, 1):
        return False, "ahead is 0 or 1"
    if ir.columns:
        if s.lanes not in LANES or s.lanes > s.threads or s.rows not in ROWS:
            return False, "lanes/rows outside the space"
        if s.threads // s.lanes > 32:
            return False, "at most 32 thread rows"
        held = s.rows * s.vec  # a round's elements a thread holds as loaded (and, ahead, the
        if held > 64 or held * ir.max_esize > 128:  # next round's too: ptxas fits both)
            return False, "at most 64 elements and 128 bytes a thread in registers"
        if s.ahead and s.split == 8 and held * ir.max_esize > 64:  # its rank loop's registers
            return False, "ahead in a cluster of 8: at most 64 bytes a round (ptxas spills)"
        if s.threads > 512:
            return False, "at most 512 threads (128 registers a thread)"
        if 4 * smem_words(s.threads, s.lanes, s.vec) > SMEM_BYTES:
            return False, "the round's totals past 48 KiB of shared memory"
        if dims is not None:
            q = math.prod(int(dims[d]) if isinstance(d, str) else d
                          for d in ir.shape[ir.axis + 1 :])  # fmt: skip
            r = _row(ir, dims)
            if s.lanes > 1 and s.lanes * s.vec >= 2 * q:
                return False, f"{s.lanes} lanes x {s.vec} for {q} columns: half idle"
            per_round = s.split * (s.threads // s.lanes) * s.rows
            least = s.threads == 32 and s.rows == 1 and s.split == 1  # a warp: the least
            if per_round > 1 and per_round >= 2 * r and not least:
                return False, f"{per_round} rows a round for {r} rows: half idle"
        return True, ""
    if s.mode == "lookback" and not 128 <= s.threads <= 512:
        return False, "a lookback tile is a block of 128 to 512 threads"
    if s.mode == "lookback" and s.chunks * s.vec > 16:
        return False, "a lookback tile holds at most 16 elements a thread in registers"
    if s.mode == "warp":
        if s.threads > 512:
            return False, "a warp row's chunks need up to 128 registers: at most 512 threads"
        if s.chunks * s.vec > 32:
            return False, "a warp row holds at most 32 elements a lane in registers"
        if dims is not None:
            n = _row(ir, dims)
            if s.chunks * s.vec > 1 and 32 * s.vec * s.chunks >= 2 * n:
                return False, f"a warp's {s.chunks} x 32 x {s.vec} for rows of {n}: half idle"
        return True, ""
    if dims is not None:
        n = _row(ir, dims)
        if s.threads > 32 and s.threads * s.vec >= 2 * n:
            return False, f"{s.threads} x {s.vec} for rows of {n}: half idle"
        if s.mode == "lookback":
            rows = math.prod(int(dims[d]) if isinstance(d, str) else d for d in ir.shape[:-1])
            tiles = rows * math.ceil(n / s.tile)
            if tiles > LOOKBACK_TILES:
                return False, f"{tiles} tiles: past the module's {LOOKBACK_TILES}"
            if n < 2 * s.tile:
                return False, f"rows of {n} fit one tile: a row a block does it"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    out = []
    layouts = [("row", 1, 1)] + [(m, c, 1) for m in ("lookback", "warp") for c in CHUNKS]
    if ir.columns:
        grid = itertools.product(THREADS, vecs(ir), LANES, ROWS, SPLITS, (0, 1))
        for t, v, ln, k, sp, a in grid:
            s = Schedule(threads=t, vec=v, mode="columns", split=sp, lanes=ln, rows=k, ahead=a)
            if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
                out.append(s)
        return out
    for t, v, (mode, c, sp) in itertools.product(THREADS, vecs(ir), layouts):
        s = Schedule(threads=t, vec=v, mode=mode, chunks=c, split=sp)
        if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
            out.append(s)
    return out


def default_schedule(ir, dims) -> Schedule:
    v = max(vecs(ir))
    n = _row(ir, dims)
    if ir.columns:
        return default_columns(ir, dims, v)
    rows = math.prod(int(dims[d]) if isinstance(d, str) else d for d in ir.shape[:-1])
    if rows < 2 * SMS:  # too few rows to fill the GPU a row a block
        for t, c in ((512, 4), (256, 4), (256, 2), (128, 1)):  # the largest tile that fits
            s = Schedule(threads=t, vec=v, mode="lookback", chunks=c)
            if is_valid(ir, s, dims)[0]:
                return s
    if rows >= 16 * SMS and n <= 32 * v * 8 * 4:
        # many short rows: a row a warp, up to eight 16-byte loads a lane in flight, no
        # block barrier (a row a block of 256 threads had one 16-byte load a thread)
        while v > 1 and 32 * v >= 2 * n:
            v //= 2
        c = 1
        while c < 8 and 32 * v * c < n and 2 * c * v <= 32:
            c *= 2
        s = Schedule(threads=256, vec=v, mode="warp", chunks=c)
        if is_valid(ir, s, dims)[0]:
            return s
    return block_row(ir, dims, v)


def block_row(ir, dims, v: int) -> Schedule:
    """A row a block: threads up to 256, at most twice the row in one chunk."""
    n = _row(ir, dims)
    t = 32
    while t < 256 and 2 * t * v < 2 * n:
        t *= 2
    s = Schedule(threads=t, vec=v)
    return s if is_valid(ir, s, dims)[0] else Schedule(threads=32, vec=1)


def default_columns(ir, dims, v: int, narrow: bool = True) -> Schedule:
    """16-byte vectors along Q, 256 threads, rows a thread in registers up to 64 elements, and
    blocks enough for about 1.5 an SM (every SM has a block and most two): first by narrower
    strips (a warp's lanes, or fewer for narrow Q, halved while a thread row still reads a
    whole 128-byte line of each row), and only then by a cluster splitting the scanned axis.
    H100, 2026-12-07 (bench/results/2026-12-07-h100-memfamilies-4), cumsum over the tokens of
    16x8192x1024 bf16: 8 lanes a strip and no cluster 194.6 us (91.0% of copy) against 32
    lanes in clusters of 4 273.1 us (no DSMEM reads, no cluster barrier a round). `narrow`
    False gives the cluster-first rule of before (a seed)."""
    size = lambda shape: math.prod(int(dims[d]) if isinstance(d, str) else d for d in shape)  # noqa: E731
    q, p, r = size(ir.shape[ir.axis + 1 :]), size(ir.shape[: ir.axis]), _row(ir, dims)
    while v > 1 and v > q:
        v //= 2
    lanes = 1
    while lanes < 32 and lanes * v < q:
        lanes *= 2
    while (  # narrower strips, each thread row still a whole line of a row, until ~1.5 an SM
        narrow
        and (lanes // 2) * v * ir.max_esize >= LINE_BYTES
        and p * math.ceil(q / (lanes * v)) * 2 < 3 * SMS
    ):
        lanes //= 2
    t = 256
    g = t // lanes
    while g > 32:
        t //= 2
        g //= 2
    k = min(16, 64 // v)
    while k > 1 and g * k >= 2 * r:
        k //= 2
    while t > max(lanes, 32) and g * k >= 2 * r:
        t //= 2
        g //= 2
    strips = p * math.ceil(q / (lanes * v))
    split = 1
    while split < 8 and strips * split * 2 < 3 * SMS and 2 * split * g * k < 2 * r:
        split *= 2
    s = Schedule(threads=t, vec=v, mode="columns", split=split, lanes=lanes, rows=k)
    if is_valid(ir, s, dims)[0]:
        return s
    return Schedule(threads=32, vec=1, mode="columns", lanes=32 if q >= 32 else 1)


def seeds(ir, dims) -> list[Schedule]:
    d = default_schedule(ir, dims)
    if ir.columns:  # rows a round, then the cluster, then the block
        out = [d]
        wide = default_columns(ir, dims, d.vec, narrow=False)  # a warp's strip, a cluster
        changes = (  # the next round's loads in flight through this round's barriers (at
            # the cluster default it gained 15%); the wide strips in a cluster (the rule of
            # before); no cluster, the blocks spread over narrower strips (no DSMEM, no
            # cluster barrier); half the block in twice the cluster (the same rows a round,
            # more blocks an SM to overlap one block's barriers with another's loads)
            {"ahead": 1},
            wide.to_dict(),
            {"lanes": max(1, d.lanes // d.split), "split": 1},
            {"threads": d.threads // 2, "split": d.split * 2},
            {"split": d.split * 2}, {"rows": d.rows // 2}, {"split": d.split // 2},
            {"threads": d.threads * 2},
            {"rows": d.rows * 2}, {"vec": d.vec // 2},
        )  # fmt: skip
        for ch in changes:
            f = {**d.to_dict(), **ch}
            if f["rows"] not in ROWS or f["split"] not in SPLITS or f["threads"] not in THREADS:
                continue
            if f["vec"] not in vecs(ir):
                continue
            s = Schedule.from_dict(f)
            if s not in out and is_valid(ir, s, dims)[0]:
                out.append(s)
        return out
    if d.mode == "warp":  # fewer loads in flight, other blocks, and a row a block
        out = [d]
        for s in (Schedule(threads=d.threads, vec=d.vec, mode="warp", chunks=d.chunks // 2),
                  Schedule(threads=d.threads // 2, vec=d.vec, mode="warp", chunks=d.chunks),
                  block_row(ir, dims, d.vec)):  # fmt: skip
            if s.chunks in CHUNKS and s.threads in THREADS and s not in out:
                if is_valid(ir, s, dims)[0]:
                    out.append(s)
        return out
    out = [d]
    for t, v in ((d.threads * 2, d.vec), (d.threads // 2, d.vec), (d.threads, d.vec // 2)):
        s = Schedule(threads=t, vec=v, mode=d.mode, chunks=d.chunks, split=d.split)
        if t in THREADS and v in vecs(ir) and s not in out and is_valid(ir, s, dims)[0]:
            out.append(s)
    return out


class ScanKernel(ColumnKernel):
    def __init__(self, ir, s, arch):
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.V = s.vec
        self.W = s.threads // 32
        self.nout = 1
        self.op = ir.outputs[0].op
        self.ident = f32_literal(IDENTITY[self.op])

    def setup(self) -> list:
        ir, b = self.ir, self.b
        o = ir.outputs[0]
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", o.name)]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        self.M, self.N = self.product(ir.shape[:-1]), self.product(ir.shape[-1:])
        self.base = {}
        for name, _ in [*ir.inputs, (o.name, o.dtype)]:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            self.base[name] = r
        self.tid = self.u32("%tid.x")
        self.lane, self.warp = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {self.lane}, {self.tid}, 31")
        b.op(f"shr.u32 {self.warp}, {self.tid}, 5")
        nmod = b.reg("b32")
        b.op(f"and.b32 {nmod}, {self.N}, {self.V - 1}")
        self.aligned = b.reg("pred")
        b.op(f"setp.eq.u32 {self.aligned}, {nmod}, 0")
        self.smem = self.u32("red_smem")
        return params

    def phys(self, kj: str, rowstart: str) -> str:
        """The element index of logical position kj of the row (from the end, reversed)."""
        b = self.b
        r = b.reg("b32")
        if self.ir.reverse:
            b.op(f"sub.u32 {r}, {self.N}, {kj}")
            b.op(f"sub.u32 {r}, {r}, 1")
            b.op(f"add.u32 {r}, {r}, {rowstart}")
        else:
            b.op(f"add.u32 {r}, {kj}, {rowstart}")
        return r

    def load_chunk(self, k0: str, rowstart: str):
        """This thread's V operand values at logical positions k0 + tid*V + j (identity past
        the row), with each position's (index, in-row predicate)."""
        ir, b, V, N = self.ir, self.b, self.V, self.N
        k = b.reg("b32")
        b.op(f"mad.lo.u32 {k}, {self.tid}, {V}, {k0}")
        kend = b.reg("b32")
        b.op(f"add.u32 {kend}, {k}, {V}")
        whole = b.reg("pred")
        b.op(f"setp.le.u32 {whole}, {kend}, {N}")
        b.op(f"and.pred {whole}, {whole}, {self.aligned}")
        vals = [b.reg("f32") for _ in range(V)]
        preds = []
        for j in range(V):
            kj, pj = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {kj}, {k}, {j}")
            b.op(f"setp.lt.u32 {pj}, {kj}, {N}")
            preds.append((kj, pj))
        if ir.reverse:
            first = b.reg("b32")  # the lowest element of the reversed vector
            b.op(f"sub.u32 {first}, {N}, {kend}")
        else:
            first = k
        elems, loaded = b.new_label("elems"), b.new_label("loaded")
        b.op(f"@!{whole} bra {elems}")
        at = b.reg("b32")
        b.op(f"add.u32 {at}, {rowstart}, {first}")
        per = {}
        for name, dtype in ir.inputs:
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
            b.op(f"add.u64 {addr}, {addr}, {self.base[name]}")
            got = self.load_vector(addr, dtype)
            per[name] = got[::-1] if ir.reverse else got
        for j in range(V):
            ev = self.evaluate({name: per[name][j] for name, _ in ir.inputs})[0]
            b.op(f"mov.f32 {vals[j]}, {ev}")
        b.op(f"bra {loaded}")
        b.label(elems)
        for j in range(V):
            kj, pj = preds[j]
            at = self.phys(kj, rowstart)
            ins = {}
            for name, dtype in ir.inputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {self.base[name]}")
                ins[name] = self.load_scalar(addr, dtype, pj)
            ev = self.evaluate(ins)[0]
            b.op(f"selp.f32 {vals[j]}, {ev}, {self.ident}, {pj}")
        b.label(loaded)
        self.last_whole, self.last_first = whole, first  # for the chunk's vector store
        return vals, preds

    def scan_store_chunk(
        self, vals, preds, carry: str, rowstart: str, whole=None, first=None
    ) -> None:
        """Scan one chunk (threads' registers, lanes by butterfly, warps through shared
        memory), starting from `carry`; store it; carry takes the chunk's total."""
        b, op, V, W = self.b, self.op, self.V, self.W
        o = self.ir.outputs[0]
        total = b.reg("f32")
        b.op(f"mov.f32 {total}, {vals[0]}")
        for j in range(1, V):
            self.combine(total, vals[j], op)
        prefix = b.reg("f32")
        b.op(f"mov.f32 {prefix}, {self.ident}")
        for off in (1, 2, 4, 8, 16):
            other = b.reg("f32")
            b.op(f"shfl.sync.bfly.b32 {other}, {total}, {off}, 31, -1")
            bit, upper = b.reg("b32"), b.reg("pred")
            b.op(f"and.b32 {bit}, {self.lane}, {off}")
            b.op(f"setp.ne.u32 {upper}, {bit}, 0")
            t1 = b.reg("f32")
            b.op(f"{COMBINE[op]} {t1}, {other}, {prefix}")
            b.op(f"selp.f32 {prefix}, {t1}, {prefix}, {upper}")
            t2 = b.reg("f32")  # the lower half's total first: the same bits on both sides
            b.op(f"{COMBINE[op]} {t2}, {other}, {total}")
            b.op(f"{COMBINE[op]} {total}, {total}, {other}")
            b.op(f"selp.f32 {total}, {t2}, {total}, {upper}")
        last = b.reg("pred")
        b.op(f"setp.eq.u32 {last}, {self.lane}, 31")
        wat = b.reg("b32")
        b.op(f"mad.lo.u32 {wat}, {self.warp}, 4, {self.smem}")
        before = b.reg("f32")
        b.op(f"mov.f32 {before}, {carry}")
        if self.s.mode == "warp":  # the warp is the row's only scanner: no shared memory
            self.combine(carry, total, op)
            W = 0
        else:
            b.op(f"@{last} st.shared.f32 [{wat}], {total}")
            b.op("bar.sync 0")
        for w in range(W):
            tw = b.reg("f32")
            b.op(f"ld.shared.f32 {tw}, [{self.smem}+{4 * w}]")
            pw = b.reg("pred")
            b.op(f"setp.gt.u32 {pw}, {self.warp}, {w}")  # warp w comes before this one
            t3 = b.reg("f32")
            b.op(f"{COMBINE[op]} {t3}, {before}, {tw}")
            b.op(f"selp.f32 {before}, {t3}, {before}, {pw}")
            self.combine(carry, tw, op)
        if W:
            b.op("bar.sync 0")
        run = b.reg("f32")
        b.op(f"{COMBINE[op]} {run}, {before}, {prefix}")
        es = ESIZE[o.dtype]
        outs = []
        for j in range(V):
            r = b.reg("f32")
            if self.ir.exclusive:
                b.op(f"mov.f32 {r}, {run}")
                self.combine(run, vals[j], op)
            else:
                self.combine(run, vals[j], op)
                b.op(f"mov.f32 {r}, {run}")
            outs.append(r)
        stored = b.new_label("chunk_stored")
        if V > 1 and whole is not None:
            # whole and aligned: one vector store (reversed rows: the vector's order reversed)
            at = b.reg("b32")
            b.op(f"add.u32 {at}, {rowstart}, {first}")
            el = b.new_label("chunk_elems")
            b.op(f"@!{whole} bra {el}")
            self.store_columns(o.dtype, self.base[o.name], at,
                               outs[::-1] if self.ir.reverse else outs, None, [])  # fmt: skip
            b.op(f"bra {stored}")
            b.label(el)
        for j in range(V):
            r = outs[j]
            kj, pj = preds[j]
            at = self.phys(kj, rowstart)
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {at}, {es}")
            b.op(f"add.u64 {addr}, {addr}, {self.base[o.name]}")
            if es == 4:
                b.op(f"@{pj} st.global.f32 [{addr}], {r}")
            else:
                h = b.reg("b16")
                b.op(f"cvt.rn.{'bf16' if o.dtype == 'bf16' else 'f16'}.f32 {h}, {r}")
                b.op(f"@{pj} st.global.b16 [{addr}], {h}")
        b.label(stored)

    def render(self) -> Emitted:
        if self.s.mode == "columns":
            return render_rounds(self)
        params = self.setup()
        if self.s.mode == "lookback":
            globals_, grid = self.lookback_body()
        elif self.s.mode == "warp":
            globals_, grid = self.warp_body()
        else:
            globals_, grid = self.row_body()
        return self.finish_kernel(params, globals_, grid)

    def row_body(self):
        ir, b, T, V = self.ir, self.b, self.s.threads, self.V
        row = self.u32("%ctaid.x")
        done = b.new_label("done")
        pr = b.reg("pred")
        b.op(f"setp.ge.u32 {pr}, {row}, {self.M}")
        b.op(f"@{pr} bra.uni {done}")  # the whole block leaves together
        rowstart = b.reg("b32")
        b.op(f"mul.lo.u32 {rowstart}, {row}, {self.N}")
        carry = b.reg("f32")
        b.op(f"mov.f32 {carry}, {self.ident}")
        k0 = self.u32(0)
        chunk, end = b.new_label("chunk"), b.new_label("chunk_end")
        b.label(chunk)
        pc = b.reg("pred")
        b.op(f"setp.ge.u32 {pc}, {k0}, {self.N}")
        b.op(f"@{pc} bra.uni {end}")
        vals, preds = self.load_chunk(k0, rowstart)
        self.scan_store_chunk(vals, preds, carry, rowstart, self.last_whole, self.last_first)
        b.op(f"add.u32 {k0}, {k0}, {T * V}")
        b.op(f"bra.uni {chunk}")
        b.label(end)
        b.label(done)
        b.op("ret")
        rows = "(" + "*".join(str(d) for d in ir.shape[:-1]) + ")" if ir.shape[:-1] else "1"
        return [], rows

    def warp_body(self):
        """A row a warp: `chunks` chunks of 32 x vec elements loaded (every load issued)
        before the first is scanned, lanes by butterfly, the carry in registers."""
        ir, b, s, V = self.ir, self.b, self.s, self.V
        row = b.reg("b32")
        b.op(f"mov.u32 {row}, %ctaid.x")
        b.op(f"mad.lo.u32 {row}, {row}, {self.W}, {self.warp}")
        done = b.new_label("done")
        pr = b.reg("pred")
        b.op(f"setp.ge.u32 {pr}, {row}, {self.M}")
        b.op(f"@{pr} bra.uni {done}")  # the whole warp leaves together
        self.tid = self.lane  # positions within a chunk are the lane's (load_chunk)
        rowstart = b.reg("b32")
        b.op(f"mul.lo.u32 {rowstart}, {row}, {self.N}")
        carry = b.reg("f32")
        b.op(f"mov.f32 {carry}, {self.ident}")
        k0 = self.u32(0)
        top, end = b.new_label("round"), b.new_label("round_end")
        b.label(top)
        pc = b.reg("pred")
        b.op(f"setp.ge.u32 {pc}, {k0}, {self.N}")
        b.op(f"@{pc} bra.uni {end}")
        chunks = []
        for c in range(s.chunks):
            kc = b.reg("b32")
            b.op(f"add.u32 {kc}, {k0}, {c * 32 * V}")
            chunks.append((*self.load_chunk(kc, rowstart), self.last_whole, self.last_first))
        for vals, preds, whole, first in chunks:
            self.scan_store_chunk(vals, preds, carry, rowstart, whole, first)
        b.op(f"add.u32 {k0}, {k0}, {s.chunks * 32 * V}")
        b.op(f"bra.uni {top}")
        b.label(end)
        b.label(done)
        b.op("ret")
        rows = "(" + "*".join(str(d) for d in ir.shape[:-1]) + ")" if ir.shape[:-1] else "1"
        return [], f"ceildiv({rows}, {self.W})"

    def block_fold(self, v: str) -> str:
        """Every thread's v combined in a fixed order (lanes by butterfly, then warps in
        order); every thread gets the result. Uses shared slots [0, W)."""
        b, op = self.b, self.op
        for off in (16, 8, 4, 2, 1):
            t = b.reg("f32")
            b.op(f"shfl.sync.bfly.b32 {t}, {v}, {off}, 31, -1")
            self.combine(v, t, op)
        l0 = b.reg("pred")
        b.op(f"setp.eq.u32 {l0}, {self.lane}, 0")
        wat = b.reg("b32")
        b.op(f"mad.lo.u32 {wat}, {self.warp}, 4, {self.smem}")
        b.op(f"@{l0} st.shared.f32 [{wat}], {v}")
        b.op("bar.sync 0")
        r = b.reg("f32")
        b.op(f"ld.shared.f32 {r}, [{self.smem}]")
        for w in range(1, self.W):
            t = b.reg("f32")
            b.op(f"ld.shared.f32 {t}, [{self.smem}+{4 * w}]")
            self.combine(r, t, op)
        b.op("bar.sync 0")
        return r

    def lookback_body(self):
        """Tiles of a row over many blocks (module docstring): a ticket hands out tiles in
        order; each publishes its aggregate, folds its predecessors' aggregates in a fixed
        order (waiting for each), then scans its tile from that prefix."""
        ir, b, s = self.ir, self.b, self.s
        T, V, W = s.threads, self.V, self.W
        tile = s.chunks * T * V
        nm = ident(ir.name)
        names = {k: f"{nm}_{k}" for k in ("ticket", "done", "epoch", "agg", "flag")}
        globals_ = [
            f".global .align 4 .u32 {names['ticket']};",
            f".global .align 4 .u32 {names['done']};",
            f".global .align 4 .u32 {names['epoch']};",
            f".global .align 16 .f32 {names['agg']}[{LOOKBACK_TILES}];",
            f".global .align 16 .u32 {names['flag']}[{LOOKBACK_TILES}];",
        ]
        g = {}
        for k, v in names.items():
            r = b.reg("b64")
            b.op(f"mov.u64 {r}, {v}")
            g[k] = r
        ntiles = self.u32("%nctaid.x")
        t0 = b.reg("pred")
        b.op(f"setp.eq.u32 {t0}, {self.tid}, 0")
        got = b.new_label("ticket")
        b.op(f"@!{t0} bra {got}")
        tk, ep = b.reg("b32"), b.reg("b32")
        b.op(f"atom.relaxed.gpu.global.add.u32 {tk}, [{g['ticket']}], 1")
        b.op(f"ld.relaxed.gpu.global.u32 {ep}, [{g['epoch']}]")
        b.op(f"st.shared.u32 [{self.smem}+{4 * W}], {tk}")
        b.op(f"st.shared.u32 [{self.smem}+{4 * (W + 1)}], {ep}")
        b.label(got)
        b.op("bar.sync 0")
        my, epoch = b.reg("b32"), b.reg("b32")
        b.op(f"ld.shared.u32 {my}, [{self.smem}+{4 * W}]")
        b.op(f"ld.shared.u32 {epoch}, [{self.smem}+{4 * (W + 1)}]")
        b.op(f"add.u32 {epoch}, {epoch}, 1")  # what this launch's flags hold
        b.op("bar.sync 0")
        tpr = b.reg("b32")  # tiles a row
        b.op(f"add.u32 {tpr}, {self.N}, {tile - 1}")
        b.op(f"shr.u32 {tpr}, {tpr}, {int(math.log2(tile))}")
        row, j = b.reg("b32"), b.reg("b32")
        b.op(f"div.u32 {row}, {my}, {tpr}")
        b.op(f"rem.u32 {j}, {my}, {tpr}")
        rowstart = b.reg("b32")
        b.op(f"mul.lo.u32 {rowstart}, {row}, {self.N}")
        k0 = b.reg("b32")
        b.op(f"mul.lo.u32 {k0}, {j}, {tile}")
        chunks = []
        for c in range(s.chunks):
            kc = b.reg("b32")
            b.op(f"add.u32 {kc}, {k0}, {c * T * V}")
            chunks.append((*self.load_chunk(kc, rowstart), self.last_whole, self.last_first))
        # the tile's aggregate, published
        agg = b.reg("f32")
        b.op(f"mov.f32 {agg}, {self.ident}")
        for vals, *_ in chunks:
            for v in vals:
                self.combine(agg, v, self.op)
        agg = self.block_fold(agg)
        pub = b.new_label("published")
        b.op(f"@!{t0} bra {pub}")
        at = b.reg("b64")
        b.op(f"mul.wide.u32 {at}, {my}, 4")
        a_ptr, f_ptr = b.reg("b64"), b.reg("b64")
        b.op(f"add.u64 {a_ptr}, {at}, {g['agg']}")
        b.op(f"add.u64 {f_ptr}, {at}, {g['flag']}")
        b.op(f"st.relaxed.gpu.global.f32 [{a_ptr}], {agg}")
        b.op(f"st.release.gpu.global.u32 [{f_ptr}], {epoch}")
        b.label(pub)
        # the prefix: the row's tiles before this one, thread i taking tiles i, i + T, ...
        first = b.reg("b32")
        b.op(f"sub.u32 {first}, {my}, {j}")  # the row's first tile
        pre = b.reg("f32")
        b.op(f"mov.f32 {pre}, {self.ident}")
        i = b.reg("b32")
        b.op(f"mov.u32 {i}, {self.tid}")
        top, end = b.new_label("look"), b.new_label("look_end")
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {i}, {j}")
        b.op(f"@{pe} bra.uni {end}")
        ti = b.reg("b32")
        b.op(f"add.u32 {ti}, {first}, {i}")
        off = b.reg("b64")
        b.op(f"mul.wide.u32 {off}, {ti}, 4")
        fa, aa = b.reg("b64"), b.reg("b64")
        b.op(f"add.u64 {fa}, {off}, {g['flag']}")
        b.op(f"add.u64 {aa}, {off}, {g['agg']}")
        spin = b.new_label("spin")
        b.label(spin)
        fl = b.reg("b32")
        b.op(f"ld.acquire.gpu.global.u32 {fl}, [{fa}]")
        pw = b.reg("pred")
        b.op(f"setp.ne.u32 {pw}, {fl}, {epoch}")
        b.op(f"@{pw} bra {spin}")
        a = b.reg("f32")
        b.op(f"ld.relaxed.gpu.global.f32 {a}, [{aa}]")
        self.combine(pre, a, self.op)
        b.op(f"add.u32 {i}, {i}, {T}")
        b.op(f"bra {top}")
        b.label(end)
        carry = self.block_fold(pre)
        for vals, preds, whole, first in chunks:
            self.scan_store_chunk(vals, preds, carry, rowstart, whole, first)
        # the last tile to finish starts the next launch afresh
        fin = b.new_label("finished")
        b.op(f"@!{t0} bra {fin}")
        d = b.reg("b32")
        b.op(f"atom.acq_rel.gpu.global.add.u32 {d}, [{g['done']}], 1")
        nm1 = b.reg("b32")
        b.op(f"sub.u32 {nm1}, {ntiles}, 1")
        pl = b.reg("pred")
        b.op(f"setp.ne.u32 {pl}, {d}, {nm1}")
        b.op(f"@{pl} bra {fin}")
        b.op(f"st.relaxed.gpu.global.u32 [{g['ticket']}], 0")
        b.op(f"st.relaxed.gpu.global.u32 [{g['done']}], 0")
        b.op(f"st.relaxed.gpu.global.u32 [{g['epoch']}], {epoch}")
        b.label(fin)
        b.op("ret")
        rows = "(" + "*".join(str(d) for d in ir.shape[:-1]) + ")" if ir.shape[:-1] else "1"
        n_text = str(ir.shape[-1])
        return globals_, f"{rows}*ceildiv({n_text}, {tile})"

    def store_columns(self, dtype, obase, at, outs, whole, preds) -> None:
        """V results at element `at`: one vector store where the columns are whole and
        aligned, else each under its predicate."""
        b, V = self.b, self.V
        es = ESIZE[dtype]
        addr = b.reg("b64")
        b.op(f"mul.wide.u32 {addr}, {at}, {es}")
        b.op(f"add.u64 {addr}, {addr}, {obase}")
        el, st = b.new_label("st_elems"), b.new_label("stored")
        if V > 1:
            if whole is not None:
                b.op(f"@!{whole} bra {el}")
            if es == 4:
                words = outs
            else:
                words = []
                cvt = "bf16x2" if dtype == "bf16" else "f16x2"
                for j in range(0, V, 2):
                    w_ = b.reg("b32")
                    b.op(f"cvt.rn.{cvt}.f32 {w_}, {outs[j + 1]}, {outs[j]}")
                    words.append(w_)
            ty = "f32" if es == 4 else "b32"
            for g in range(0, len(words), 4):  # 16 bytes a store at most
                group = words[g : g + 4]
                at_ = f"[{addr}+{4 * g}]" if g else f"[{addr}]"
                if len(group) == 1:
                    b.op(f"st.global.{ty} {at_}, {group[0]}")
                else:
                    b.op(f"st.global.v{len(group)}.{ty} {at_}, {{{', '.join(group)}}}")
            if whole is None:
                return
            b.op(f"bra {st}")
            b.label(el)
        for j in range(V):
            if es == 4:
                b.op(f"@{preds[j]} st.global.f32 [{addr}+{4 * j}], {outs[j]}")
            else:
                h = b.reg("b16")
                b.op(f"cvt.rn.{'bf16' if dtype == 'bf16' else 'f16'}.f32 {h}, {outs[j]}")
                b.op(f"@{preds[j]} st.global.b16 [{addr}+{2 * j}], {h}")
        b.label(st)

    def finish_kernel(self, params, globals_, grid) -> Emitted:
        ir, s, b = self.ir, self.s, self.b
        entry = f"{ident(ir.name)}_scan_{s.tag()}"
        body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{self.W + 2}];"]
        ptx = module_text(
            family="scan", workload=ir.name, schedule=s.to_dict(), arch=self.arch,
            entry=entry, params=params, threads=s.threads, body=body, lines=b.lines,
            globals_=globals_,
        )  # fmt: skip
        narrow = s.threads == 512 and s.vec * ir.max_esize < 16  # spills at 64 registers
        if s.mode == "lookback" and not narrow:
            # 1024 threads an SM (registers held to 64): a tile's ticket, look-back and
            # barriers are latency that only other blocks' loads hide (one 512-thread block
            # an SM at 70 registers reached 54% of copy on an H100)
            head = f".maxntid {s.threads}, 1, 1"
            ptx = ptx.replace(head, f"{head}\n.minnctapersm {1024 // s.threads}", 1)
        return Emitted(ptx, entry, tuple(params), Launch((grid, 1, 1), (s.threads, 1, 1)))


def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
    def render(ir, s, arch):
        return ScanKernel(ir, s, arch).render()

    return checked_emit("scan", ARCHS, Schedule, is_valid, render, ir, schedule, arch)


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return [
        log2(elements),
        log2(s.threads),
        float(s.vec * 4),
        float(s.mode == "lookback"),
        float(s.chunks),
    ]


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    if s.mode == "lookback":
        return (
            f"scan: tiles of {s.chunks} x {s.threads} threads x {s.vec} elements over many "
            "blocks, each folding the aggregates before it"
        )
    if s.mode == "warp":
        return (
            f"scan: a row a warp ({s.threads // 32} a block), {s.chunks} x {s.vec} elements "
            "a lane in flight"
        )
    if s.mode == "columns":
        return (
            f"scan: columns, {s.lanes} lanes x {s.vec} along them, {s.rows} rows a thread, "
            f"{s.threads} threads, a cluster of {s.split}"
            + (", the next round's loads ahead" if s.ahead else "")
        )
    return f"scan: a row a block of {s.threads} threads x {s.vec} elements in registers"


FAMILY = Family(
    name="scan",
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
    legend="scan: threads of a row's block x elements a thread scans in registers",
    features=features,
    feature_fields=("threads", "vec", "mode", "chunks"),
    roofline=lambda workload, dims: Roofline(bytes=io_bytes(workload, dims)),
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.colreduce.baselines",
    layout_fields=("threads", "vec"),
)

__all__ = ["FAMILY", "ScanIR", "Schedule", "lower"]
