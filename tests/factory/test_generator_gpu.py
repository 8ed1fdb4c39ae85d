"""Generated kernels are correct on the GPU: every example operator, several schedule families,
at benchmark-like shapes and held-out ones (one row, odd N, N not a multiple of the vector width,
N a multiple of it that the layout does not divide, rows longer than the register capacity).
Compared with a float64 evaluation of the same DAG.

Runs under pytest (marked gpu: skipped without a GPU) and as a script on a GPU host:
    PYTHONPATH=. python3 tests/factory/test_generator_gpu.py [--catalogue] [--out DIR]
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from test_ir_examples import EXAMPLES, bf16_to_f64, eval64, f64_to_bf16  # noqa: E402

from factory.compile import compile_ptx, rejection_reason  # noqa: E402
from factory.emit import emit  # noqa: E402
from factory.families.row.ir import ROLE_COL, ROLE_ROW, ROLE_ROWSCALAR, ROLE_SCALAR  # noqa: E402
from factory.families.row.schedules import (  # noqa: E402
    Schedule,
    default_schedule,
    fit_tail,
    flat_ok,
    has_col_inputs,
    has_early_outputs,
    is_valid,
    packed_pairs,
    shift_ok,
)
from factory.spec import eval_dim_expr  # noqa: E402

SHAPES = [
    {"M": 64, "N": 4096},
    {"M": 1, "N": 4095},
    {"M": 33, "N": 1000},
    {"M": 3, "N": 8},
    {"M": 5, "N": 40000},
    {"M": 131, "N": 8192},
]


def schedules_for(ir) -> list[Schedule]:
    base = default_schedule(ir, {"M": 1024, "N": 4096})
    out = [
        base,
        replace(base, threads_per_row=32, rows_per_block=4, chunks=8, store_hint="none"),
        replace(base, threads_per_row=1024, chunks=1, load_hint="nc", persistent_blocks_per_sm=2),
        replace(base, mode="stream", threads_per_row=256, chunks=2, load_hint="evict_first"),
        replace(base, mode="cached", threads_per_row=64, rows_per_block=2, chunks=8),
    ]
    if ir.online:
        out.append(replace(base, mode="stream", online=True, threads_per_row=512, chunks=4))
        out.append(replace(base, mode="cached", online=True, threads_per_row=128, chunks=4))
    out.append(replace(base, prefetch_rows=True, persistent_blocks_per_sm=2, chunks=2))
    out.append(replace(base, keep_intermediates=False, threads_per_row=256, chunks=2))
    if ir.min_elem_bytes() == 2:
        out.append(replace(base, vec_elems=4, threads_per_row=256, store_hint="noalloc"))
    if ir.moments:  # mean and variance in one pass (Chan's merge), in registers and streamed
        out.append(replace(base, moments=True, threads_per_row=128, chunks=4))
        out.append(replace(base, moments=True, mode="stream", threads_per_row=256, chunks=2))
    # two multi-warp row groups per block on the block barrier (odd M: a group past the rows),
    # with L2 eviction policies on the row loads and the stores
    out.append(
        replace(base, threads_per_row=128, rows_per_block=2, chunks=4, load_hint="nc_l2last")
    )
    out.append(replace(base, threads_per_row=64, rows_per_block=4, chunks=8, store_hint="l2first"))
    # per-column vectors loaded with the row, and early row outputs stored last
    late = {"early_cols": has_col_inputs(ir)}
    late["late_stores"] = has_early_outputs(ir)
    if any(late.values()):
        out.append(replace(base, **late))
    if has_col_inputs(ir):  # per-column vectors loaded, and outputs stored, in fenced groups
        out.append(replace(base, threads_per_row=256, chunks=4, col_groups=4))
        out.append(replace(base, threads_per_row=128, chunks=4, col_hint="nc_l2last"))
    # partial accumulators by trees, cached and streamed; gathered elements loaded first
    out.append(replace(base, threads_per_row=128, chunks=4, acc_split=4))
    out.append(replace(base, mode="stream", threads_per_row=64, chunks=4, acc_split=8))
    if ir.gathers:
        out.append(replace(base, early_gather=True, acc_split=2))
    if ir.online and packed_pairs(ir):  # the online max on packed 16-bit pairs
        out.append(replace(base, mode="stream", online=True, chunks=6, packed_max=True))
        out.append(replace(base, online=True, threads_per_row=128, chunks=4, packed_max=True))
    # the row's tail moved as whole vectors (N = 1000 and 40000: multiples of 8 that these
    # layouts do not divide), cached, in fenced column groups, streamed, online
    out.append(replace(base, tail="vectors"))
    out.append(replace(base, mode="stream", threads_per_row=256, chunks=2, tail="vectors"))
    if has_col_inputs(ir):
        out.append(replace(base, threads_per_row=256, chunks=4, col_groups=4, tail="vectors"))
    if ir.online:
        out.append(
            replace(base, mode="stream", online=True, threads_per_row=512, chunks=4, tail="vectors")
        )
    # the element tail strided T apart (N = 4095 and 1000's cached rows, a streamed row)
    out.append(replace(base, tail="strided"))
    out.append(replace(base, mode="stream", threads_per_row=256, chunks=2, tail="strided"))
    # a streamed row walked from the aligned address at or before its start (N = 4095, 1000,
    # 40000 and 8: shifted rows, whole ones, and rows shorter than a step)
    # (and held in registers: 64 threads x 8 x 8 chunks hold 4095 and 1000 shifted by up to
    # 7; 4096 and 8192 rows stream)
    shifted = replace(base, mode="stream", threads_per_row=128, chunks=2, tail="shifted")
    if shift_ok(ir, shifted):
        out.append(shifted)
        out.append(replace(shifted, mode="cached", threads_per_row=64, chunks=8))
        if ir.online:
            out.append(replace(shifted, online=True, threads_per_row=256, chunks=4))
    # an elementwise operator's rows walked as one run of tiles (whatever N is)
    one_tile = dict(mode="cached", rows_per_block=1, persistent_blocks_per_sm=0)
    if flat_ok(ir, replace(base, flat=True, prefetch_rows=False, **one_tile)):
        out.append(replace(base, flat=True, prefetch_rows=False, **one_tile))
        out.append(
            replace(base, flat=True, prefetch_rows=False, threads_per_row=128, chunks=4, **one_tile)
        )
    # a streamed row kept in L2 between its passes
    out.append(replace(base, mode="stream", threads_per_row=512, chunks=2, load_hint="nc_l2reuse"))
    # a row shared by a cluster of two 1024-thread blocks (distributed shared memory)
    one_row = dict(rows_per_block=1, persistent_blocks_per_sm=0, prefetch_rows=False)
    out.append(replace(base, threads_per_row=2048, chunks=2, cluster_blocks=2, **one_row))
    if ir.online:
        out.append(
            replace(
                base,
                mode="stream",
                online=True,
                threads_per_row=4096,
                chunks=1,
                cluster_blocks=4,
                **one_row,
            )  # fmt: skip
        )
    return out


# ---------------------------------------------------------------- data

STORAGE = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16}


def to_storage(a, dt):
    if dt == "bf16":
        return f64_to_bf16(a)
    if dt in ("int32", "int64"):
        return a.astype(dt)
    return a.astype(STORAGE[dt])


def to_f64(a, dt):
    if dt == "bf16":
        return bf16_to_f64(a)
    return a.astype(np.float64)


def make_inputs(ir, dims, rng):
    m, n = dims["M"], dims["N"]
    host, f64 = {}, {}
    for t in ir.inputs:
        shape = {ROLE_ROW: (m, n), ROLE_COL: (n,), ROLE_ROWSCALAR: (m,), ROLE_SCALAR: (1,)}[t.role]
        if t.dtype in ("int32", "int64"):
            a = rng.integers(0, n, size=shape)
        elif t.name == "mask":
            a = rng.uniform(0, 1, size=shape)
        else:
            a = (
                rng.uniform(-4, 4, size=shape)
                if t.role == ROLE_ROW
                else rng.uniform(0.5, 1.5, shape)
            )
        st = to_storage(a, t.dtype)
        host[t.name] = st
        f64[t.name] = st.astype(np.int64) if t.dtype.startswith("int") else to_f64(st, t.dtype)
        if t.role == ROLE_ROWSCALAR and not t.dtype.startswith("int"):
            f64[t.name] = f64[t.name].reshape(m, 1)
    return host, f64


class Gpu:
    def __init__(self):
        from cuda.bindings import driver as cu
        from cuda.core import Device

        self.cu = cu
        self.dev = Device()
        self.dev.set_current()
        self.stream = self.dev.create_stream()

    def _ck(self, res):
        if res[0] != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error {res[0]}")
        return res[1] if len(res) > 1 else None

    def alloc(self, nbytes):
        return int(self._ck(self.cu.cuMemAlloc(max(nbytes, 16))))

    def free(self, p):
        self._ck(self.cu.cuMemFree(p))

    def upload(self, p, a):
        a = np.ascontiguousarray(a)
        self._ck(self.cu.cuMemcpyHtoD(p, a.ctypes.data, a.nbytes))

    def download(self, p, a):
        self._ck(self.cu.cuMemcpyDtoH(a.ctypes.data, p, a.nbytes))
        return a

    def poison(self, p, nbytes):
        self._ck(self.cu.cuMemsetD8(p, 0xFF, nbytes))  # NaN in every float format

    def run(self, cubin, em, args, dims):
        from cuda.core import ObjectCode, launch

        from gpuworker.gpu import launch_config

        kernel = ObjectCode.from_cubin(cubin).get_kernel(em.entry)
        grid = tuple(eval_dim_expr(g, dims) for g in em.launch.grid)
        cfg = launch_config(grid, em.launch.block, 0, em.launch.cluster)
        launch(self.stream, cfg, kernel, *args)
        self.stream.sync()


def check_case(gpu, name, ir, sched, dims, seed=0) -> dict:
    rec = {"op": name, "schedule": sched.tag(), "dims": dims}
    em = emit(ir, sched)
    rep = compile_ptx(em.ptx)
    if not rep.ok:
        return rec | {"passed": False, "reason": "compile: " + rep.log[:300]}
    rec["registers"] = rep.registers
    why = rejection_reason(rep, sched.threads_per_block)
    if why:
        rec["warning"] = why
    rng = np.random.default_rng(seed)
    host, f64 = make_inputs(ir, dims, rng)
    m, n = dims["M"], dims["N"]
    ptrs, outs = {}, {}
    for t in ir.inputs:
        ptrs[t.name] = gpu.alloc(host[t.name].nbytes)
        gpu.upload(ptrs[t.name], host[t.name])
    for o in ir.outputs:
        shape = (m, n) if o.role == ROLE_ROW else (m,)
        outs[o.name] = np.zeros(shape, STORAGE[o.dtype])
        ptrs[o.name] = gpu.alloc(outs[o.name].nbytes)
        gpu.poison(ptrs[o.name], outs[o.name].nbytes)
    args = []
    for p in em.params:
        args.append(ptrs[p.name] if p.kind == "tensor" else np.uint32(dims[p.name]))
    try:
        gpu.run(rep.cubin, em, args, dims)
        ok, worst = True, []
        for o in ir.outputs:
            got = to_f64(gpu.download(ptrs[o.name], outs[o.name]), o.dtype)
            ref = np.broadcast_to(eval64(o.node, f64), (m, n) if o.role == ROLE_ROW else (m, 1))
            ref = ref.reshape(got.shape)
            tight = o.dtype == "fp32" and ir.tolerance_rel_norm < 1e-3
            # The manifest defaults (factory.spec.manifest.DEFAULT_TOLERANCE) for fp32 and bf16.
            rel_tol, atol, rtol = (1e-5, 1e-5, 1e-4) if tight else (1e-2, 1e-2, 2e-2)
            err = np.abs(got - ref)
            rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
            bad = ~(err <= atol + rtol * np.abs(ref))
            this_ok = bool(np.isfinite(got).all()) and rel <= rel_tol and not bad.any()
            worst.append(f"{o.name}: rel {rel:.2e} max {np.nanmax(err):.2e} bad {int(bad.sum())}")
            ok = ok and this_ok
        rec |= {"passed": ok, "reason": "; ".join(worst)}
    except Exception as e:  # noqa: BLE001 - a crash is a failed case, recorded
        rec |= {"passed": False, "reason": f"crash: {e}"}
    finally:
        for p in ptrs.values():
            gpu.free(p)
    return rec


def all_cases():
    for name, make in EXAMPLES.items():
        ir = make()
        for sched in schedules_for(ir):
            for dims in SHAPES:
                yield name, ir, sched, dims


@pytest.fixture(scope="module")
def gpu():
    return Gpu()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_generated_kernels_match_the_float64_reference(gpu, name):
    ir = EXAMPLES[name]()
    failures = []
    for sched in schedules_for(ir):
        for dims in SHAPES:
            rec = check_case(gpu, name, ir, sched, dims)
            if not rec["passed"]:
                failures.append(rec)
    assert not failures, failures[:5]


# Layouts of 3, 5, 6 or 7 chunks, the fewest that cover a row at that many threads (bf16: 3072
# at 128 threads and at 64, 768 at a warp, 5000 and 7168 at 128; fp32 holds half as many
# elements a chunk), each at the length it fills, at 8 fewer (the whole-vector tail) and at 3
# fewer (the element tail, or tiles for an elementwise row).
FEWEST_CHUNKS = [(3072, 128), (3072, 64), (768, 32), (5000, 128), (7168, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_layouts_of_chunk_counts_other_than_powers_of_two(gpu, name):
    ir = EXAMPLES[name]()
    failures, counts = [], set()
    for n, t in FEWEST_CHUNKS:
        shapes = [{"M": 9, "N": n}, {"M": 2, "N": n - 8}, {"M": 9, "N": n - 3}]
        base = default_schedule(ir, shapes[0])
        c = -(-n // (t * base.vec_elems))
        s = replace(base, mode="cached", threads_per_row=t, chunks=c, rows_per_block=1)
        s = fit_tail(ir, replace(s, rows_per_block=4) if t == 32 else s, shapes)
        if c > 8 or not all(is_valid(ir, s, d)[0] for d in shapes):
            continue
        counts.add(c)
        # the same layout shifted (n - 3: 9 rows at every offset within 16 bytes), and with
        # its columns loaded one chunk at a time (a norm's weight as 4-byte words put in place)
        variants = [s]
        shifted = replace(s, tail="shifted")
        if all(is_valid(ir, shifted, d)[0] for d in shapes):
            variants.append(shifted)
            grouped = replace(shifted, col_groups=c)
            if has_col_inputs(ir) and all(is_valid(ir, grouped, d)[0] for d in shapes):
                variants.append(grouped)
        for v in variants:
            for dims in shapes:
                rec = check_case(gpu, name, ir, v, dims)
                if not rec["passed"]:
                    failures.append(rec)
    assert counts - {1, 2, 4, 8} and not failures, (counts, failures[:5])


# ---------------------------------------------------------- the catalogue, through factory.spec


def _catalogue():
    from factory.families.row.ir import Unsupported, lower
    from factory.spec import load_catalogue

    out = {}
    for name, w in sorted(load_catalogue().items()):
        try:
            out[name] = (w, lower(w))
        except Unsupported:
            continue
    return out


def check_catalogue_case(gpu, w, ir, sched, dims, seed=0, sample_rows=None) -> dict:
    """Run one catalogue operator on factory.spec's random inputs and compare with its float64
    reference under the manifest's tolerance (on `sample_rows` only, for the big shapes)."""
    from factory.spec import random_inputs, reference, to_float64

    rec = {"op": w.name, "schedule": sched.tag(), "dims": dims}
    em = emit(ir, sched)
    rep = compile_ptx(em.ptx)
    if not rep.ok:
        return rec | {"passed": False, "reason": "compile: " + rep.log[:300]}
    host = random_inputs(w, dims, seed)
    rows_dim = ir.batch_dims[0]
    m = dims[rows_dim]
    ptrs, outs = {}, {}
    for name, a in host.items():
        ptrs[name] = gpu.alloc(a.nbytes)
        gpu.upload(ptrs[name], a)
    for o in w.outputs:
        shape = tuple(dims[d] if isinstance(d, str) else d for d in o.shape)
        outs[o.name] = np.zeros(
            shape, {"bf16": np.uint16, "fp16": np.float16}.get(o.dtype, np.float32)
        )
        ptrs[o.name] = gpu.alloc(outs[o.name].nbytes)
        gpu.poison(ptrs[o.name], outs[o.name].nbytes)
    args = [ptrs[p.name] if p.kind == "tensor" else np.uint32(dims[p.name]) for p in em.params]
    rows = list(range(m)) if sample_rows is None else sorted({r % m for r in sample_rows})
    try:
        gpu.run(rep.cubin, em, args, dims)
        sub = {}
        for t in w.inputs:
            a = host[t.name]
            sub[t.name] = a[rows] if t.shape and t.shape[0] == rows_dim else a
        ref = reference(w, sub, dims | {rows_dim: len(rows)})
        ok, notes = True, []
        for o in w.outputs:
            got = to_float64(gpu.download(ptrs[o.name], outs[o.name])[rows], o.dtype)
            want = np.asarray(ref[o.name]).reshape(got.shape)
            tol = w.tolerance[o.dtype]
            err = np.abs(got - want)
            rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
            bad = ~(err <= tol.atol + tol.rtol * np.abs(want))
            this = bool(np.isfinite(got).all()) and rel <= tol.rel_norm and not bad.any()
            ok = ok and this
            notes.append(f"{o.name}: rel {rel:.2e} bad {int(bad.sum())}")
        rec |= {"passed": ok, "reason": "; ".join(notes)}
    except Exception as e:  # noqa: BLE001 - a crash is a failed case
        rec |= {"passed": False, "reason": f"crash: {e}"}
    finally:
        for p in ptrs.values():
            gpu.free(p)
    return rec


def catalogue_cases():
    """Every catalogue operator: its suite candidates at each suite shape (sampled rows), and
    the default schedule of the first shape at every held-out shape (every row)."""
    from factory.families.row.seeds import candidate_schedules

    for name, (w, ir) in _catalogue().items():
        for dims in w.shapes:
            for s in candidate_schedules(ir, dict(dims), limit=2):
                yield w, ir, s, dict(dims), [0, 1, 4097, -1]
        s0 = default_schedule(ir, dict(w.shapes[0]))
        for dims in w.heldout_shapes:
            yield w, ir, s0, dict(dims), None
            own = default_schedule(ir, dict(dims))  # with the whole-vector tail where it runs
            if own.tail != "elements":
                yield w, ir, own, dict(dims), None


@pytest.mark.gpu
def test_the_catalogue_matches_its_float64_reference_at_suite_and_heldout_shapes(gpu):
    failures = []
    for w, ir, s, dims, rows in catalogue_cases():
        rec = check_catalogue_case(gpu, w, ir, s, dims, sample_rows=rows)
        if not rec["passed"]:
            failures.append(rec)
    assert not failures, failures[:5]


def short_row_cases():
    """Rows under a warp (4-16 threads each, several rows a warp): every catalogue operator's
    default layout at rows of 64, 100, 128, 200 and 256 elements, and the first uncapped layout
    of each width in its space there (at 100 and 200 also the first of 8, 16 and 32 threads with
    two rows a thread), at 4099 rows (the last block's groups past the end switch
    their stores off), and the default looping at 20483 rows in a persistent grid of two blocks
    per SM (the warp leaving the loop as one), the next row prefetched and per-column vectors
    held across rows; each layout also at rows of 300 (the stream path of a layout for short rows)
    and of 5 (not of whole vectors: streamed under the "stream" tail)."""
    from factory.families.row.schedules import holds_cols, space

    for _name, (w, ir) in _catalogue().items():
        for n in (64, 100, 128, 200, 256):
            dims = {ir.batch_dims[0]: 4099, ir.row_dim: n}
            base = default_schedule(ir, dims)
            loop = replace(base, persistent_blocks_per_sm=2, prefetch_rows=True, early_cols=True)
            if not holds_cols(loop) or not is_valid(ir, loop, dims)[0]:
                loop = replace(loop, early_cols=False)
            layouts = [base, loop]  # (the loop at 20483 rows: 2.4 passes of its 264 blocks)
            for t in (4, 8, 16):  # the first uncapped layout of each width in the space
                sp = [s for s in space(ir, [dims]) if s.threads_per_row == t]
                layouts += [s for s in sp if not s.min_threads_per_sm][:1]
            for t in (8, 16, 32) if n in (100, 200) else ():  # and of two rows a thread
                sp = [s for s in space(ir, [dims]) if s.threads_per_row == t]
                layouts += [s for s in sp if s.rows_per_thread == 2 and not s.min_threads_per_sm][
                    :1
                ]
            for s in dict.fromkeys(layouts):
                m = 20483 if s.persistent_blocks_per_sm else 4099
                for length in (n, 300, 5):
                    yield w, ir, s, {ir.batch_dims[0]: m, ir.row_dim: length}


@pytest.mark.gpu
def test_rows_under_a_warp_match_the_float64_reference(gpu):
    failures = []
    for w, ir, s, dims in short_row_cases():
        rec = check_catalogue_case(gpu, w, ir, s, dims)
        if not rec["passed"]:
            failures.append(rec)
    assert not failures, failures[:5]


def main() -> int:
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    gpu = Gpu()
    t0 = time.time()
    recs = [check_case(gpu, *c) for c in all_cases()]
    if "--catalogue" in sys.argv:
        for w, ir, s, dims, rows in catalogue_cases():
            recs.append(check_catalogue_case(gpu, w, ir, s, dims, sample_rows=rows))
        for w, ir, s, dims in short_row_cases():
            recs.append(check_catalogue_case(gpu, w, ir, s, dims))
    fails = [r for r in recs if not r["passed"]]
    for r in fails[:60]:
        print("FAIL", r["op"], r["schedule"], r["dims"], r["reason"][:200])
    print(f"{len(recs) - len(fails)}/{len(recs)} passed in {time.time() - t0:.1f} s")
    if out_dir:
        with open(os.path.join(out_dir, "generator_gpu_check.json"), "w") as f:
            json.dump(recs, f, indent=1)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
