"""The paths that keep a workspace in the PTX module (allreduce's ticket, scan's lookback
tiles) run in factory.ptxsim here, with what the interpreter does not model supplied by this
test alone: module-scope `.global` arrays (allocated zeroed, as a module load does),
`atom.add.u32` (one thread runs its instructions without interruption until a barrier or a
shuffle, so a read-add-write there is atomic), `div/rem.u32`, and memory-order qualifiers
(relaxed/acquire/release: the interpreter's blocks run one at a time, in block order, so every
ticket's predecessors have finished). Each kernel runs twice on one memory: the second launch
checks that the first left the ticket, the counters and the epoch ready for it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from factory import ptxsim
from factory.families import allreduce as A
from factory.families import scan as SC
from factory.spec import eval_dim_expr, load_manifest, random_inputs, reference, to_float64

_GLOBAL = re.compile(r"^\.global\s+\.align\s+\d+\s+\.(\w+)\s+(\w+)(?:\[(\d+)\])?;", re.M)


@pytest.fixture
def workspace_ops(monkeypatch):
    plain = ptxsim._body

    def body(k, op, a):
        parts = op.split(".")
        if parts[0] in ("div", "rem") and parts[-1] == "u32":
            x, y = ptxsim._expr(k, a[1]), ptxsim._expr(k, a[2])
            sym = "//" if parts[0] == "div" else "%"
            return [f"r[{a[0]!r}] = ({x} {sym} {y}) & 0xFFFFFFFF"]
        if parts[0] == "atom" and parts[-2] == "add" and parts[-1] == "u32":
            return [
                f"ad = {ptxsim._addr(k, a[1])}",
                "old = th.mem.read(ad, 4)",
                f"th.mem.write(ad, 4, (old + {ptxsim._expr(k, a[2])}) & 0xFFFFFFFF)",
                f"r[{a[0]!r}] = old",
            ]
        return plain(k, op, a)

    monkeypatch.setattr(ptxsim, "_body", body)


def run_twice(em, dims, arrays, outputs=()):
    """Both launches' outputs, on one memory (the module's globals live across launches; the
    named outputs poisoned with NaN before each launch)."""
    mem = ptxsim.Memory()
    ptx = em.ptx
    for ty, name, count in _GLOBAL.findall(ptx):
        size = 4 * (int(count) if count else 1)
        addr = mem.alloc(name, b"\0" * size)
        ptx = re.sub(rf"(mov\.u64\s+%\w+,\s*){name};", rf"\g<1>{addr};", ptx)
    ptx = re.sub(r"\.(relaxed|acquire|release)\.gpu\.global", ".global", ptx)
    ptx = re.sub(r"\b((?:ld|st)\.(?:global|shared))\.u32\b", r"\1.b32", ptx)
    k = ptxsim.Kernel(ptx)
    params = {}
    for (_, pname), p in zip(k.params, em.params, strict=True):
        if p.kind == "tensor":
            params[pname] = mem.alloc(p.name, np.ascontiguousarray(arrays[p.name]).tobytes())
        else:
            params[pname] = int(dims[p.name])
    grid = int(eval_dim_expr(em.launch.grid[0], dims))
    size = em.launch.cluster[0] if em.launch.cluster else 1
    outs = []
    for _ in range(2):
        for name in outputs:
            at, n = mem.allocs[name]
            mem.buf[at - mem.BASE : at - mem.BASE + n] = b"\xff" * n
        for c in range(0, grid, size):
            ptxsim.run_blocks(k, list(range(c, c + size)), grid, em.launch.block[0], params, mem)
        outs.append({name: mem.get(name) for name in arrays})
    return outs


M = """
name = "{name}"
[inputs.x]
shape = ["M", "N"]
dtype = "{dt}"
[outputs.y]
expr = "{expr}"
dtype = "fp32"
[[shapes]]
M = 2
N = 4096
"""


def check(w, em, dims):
    ins = random_inputs(w, dims, 3)
    o = w.outputs[0]
    shape = tuple(int(dims[d]) if isinstance(d, str) else d for d in o.shape)
    arrays = dict(ins) | {o.name: np.full(shape, np.nan, np.float32)}
    first, second = run_twice(em, dims, arrays, outputs=(o.name,))
    want = reference(w, ins, dims)[o.name]
    tol = w.tolerance["fp32"]
    for out in (first, second):
        got = to_float64(np.frombuffer(out[o.name], np.float32).reshape(shape), "fp32")
        assert np.isfinite(got).all()
        assert (np.abs(got - want) <= tol.atol + tol.rtol * np.abs(want)).all()
    assert first[o.name] == second[o.name]  # the same bits: the order is fixed
    return first


@pytest.mark.parametrize(
    "expr, dt, dims, s",
    [
        (
            "sum(x, axis=None)",
            "fp32",
            {"M": 5, "N": 999},
            A.Schedule(threads=128, vec=4, combine="ticket", blocks=132, unroll=1),
        ),
        (
            "mean(x * x, axis=(0, 1))",
            "bf16",
            {"M": 3, "N": 4096},
            A.Schedule(threads=256, vec=8, combine="ticket", blocks=132, unroll=2),
        ),
        (
            "max(abs(x), axis=None)",
            "fp32",
            {"M": 7, "N": 513},
            A.Schedule(threads=128, vec=2, combine="ticket", blocks=264, unroll=2),
        ),
    ],  # fmt: skip
    ids=str,
)
def test_the_ticket_path_computes_the_reference_twice(workspace_ops, expr, dt, dims, s):
    w = load_manifest(M.format(name="tk", expr=expr, dt=dt))
    em = A.emit(A.lower(w), s)
    assert int(eval_dim_expr(em.launch.grid[0], dims)) > 1  # several blocks take tickets
    check(w, em, dims)


@pytest.mark.parametrize(
    "expr, dims, s",
    [
        (
            "cumsum(x, axis=-1)",
            {"M": 2, "N": 3000},
            SC.Schedule(threads=128, vec=4, mode="lookback", chunks=1),
        ),
        (
            "cumsum(x, axis=-1, exclusive=True, reverse=True)",
            {"M": 3, "N": 1500},
            SC.Schedule(threads=128, vec=2, mode="lookback", chunks=2),
        ),
        (
            "cumprod(1.0 + 0.001 * x, axis=-1)",
            {"M": 1, "N": 2100},
            SC.Schedule(threads=128, vec=1, mode="lookback", chunks=4),
        ),
    ],  # fmt: skip
    ids=str,
)
def test_the_lookback_tiles_compute_the_reference_twice(workspace_ops, expr, dims, s):
    w = load_manifest(M.format(name="lb", expr=expr, dt="fp32"))
    ir = SC.lower(w)
    em = SC.emit(ir, s)
    assert int(eval_dim_expr(em.launch.grid[0], dims)) >= 2 * dims["M"]  # tiles a row
    check(w, em, dims)
