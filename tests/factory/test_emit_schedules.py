"""Schedule spaces: serialisable points, one validity predicate, a sensible default."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, fields, replace

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_ir_examples import EXAMPLES  # noqa: E402

from factory.families.row.ir import lower  # noqa: E402
from factory.families.row.schedules import (  # noqa: E402
    Schedule,
    default_schedule,
    fit_tail,
    fits_job,
    is_valid,
    shift_ok,
    space,
    split_twin,
    tail_runs,
)
from factory.spec import load_catalogue  # noqa: E402

SUITE = [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}]


def test_a_schedule_round_trips_through_json_and_has_only_simple_fields():
    s = Schedule(threads_per_row=512, chunks=2, mode="stream", online=True)
    d = json.loads(json.dumps(asdict(s)))
    assert Schedule.from_dict(d) == s
    assert all(f.type in ("int", "bool", "str") for f in fields(Schedule))


def test_from_dict_refuses_unknown_fields():
    with pytest.raises(ValueError, match="unknown schedule fields"):
        Schedule.from_dict({"threads": 3})


@pytest.mark.parametrize("name", ["softmax", "layernorm", "silu_mul", "cross_entropy"])
def test_the_default_is_valid_at_its_dims(name):
    ir = EXAMPLES[name]()
    for dims in SUITE + [{"M": 4096, "N": 32000}, {"M": 4096, "N": 128256}]:
        s = default_schedule(ir, dims)
        ok, why = is_valid(ir, s, dims)
        assert ok, (dims, s, why)


def test_the_space_holds_only_points_that_fit_every_shape_of_the_job():
    ir = EXAMPLES["softmax"]()
    sp = space(ir, SUITE)
    assert len(sp) > 20 and len(set(sp)) == len(sp)
    for s in sp:
        valid = [is_valid(ir, s, d)[0] for d in SUITE]
        if s.mode == "stream":
            assert all(valid)
        else:  # valid at one shape at least; elsewhere only the register capacity differs
            assert any(valid) and all(is_valid(ir, s, d, capacity=False)[0] for d in SUITE)
    assert any(s.mode == "stream" and s.online for s in sp)
    # Rows of 4096 and 8192: no register layout holds both, yet the job can time the ones that
    # hold either (a longer row streams through the kernel's long-row path).
    cached = {(s.threads_per_row * s.vec_elems * s.chunks) for s in sp if s.mode == "cached"}
    assert {4096, 8192} <= cached
    assert not fits_job(ir, replace(sp[0], mode="cached", threads_per_row=32, chunks=1), SUITE)


def test_validity_says_why():
    ir = EXAMPLES["softmax"]()
    base = default_schedule(ir, SUITE[0])
    cases = {
        "1024": replace(base, threads_per_row=1024, rows_per_block=2),
        "capacity": replace(base, chunks=1, threads_per_row=64),
        "power of two": replace(base, threads_per_row=96),
        "unknown mode": replace(base, mode="tiles"),
    }
    for words, s in cases.items():
        ok, why = is_valid(ir, s, SUITE[0])
        assert not ok and words in why, (words, why)


def test_fast_math_is_refused_where_the_tolerance_is_tight():
    ir = EXAMPLES["softmax_fp32"]()
    s = replace(default_schedule(ir, SUITE[0]), fast_math=True)
    ok, why = is_valid(ir, s, SUITE[0])
    assert not ok and "tolerance" in why
    assert default_schedule(ir, SUITE[0]).fast_math is False


def test_past_1024_threads_a_row_takes_a_cluster_of_1024_thread_blocks():
    ir = EXAMPLES["softmax"]()
    dims = {"M": 512, "N": 131072}
    clustered = [s for s in space(ir, [dims]) if s.cluster_blocks > 1]
    assert clustered, "a 131072-long row has no cluster layouts"
    for s in clustered:
        assert s.threads_per_row == 1024 * s.cluster_blocks and s.threads_per_block == 1024
        assert s.rows_per_block == 1 and not s.persistent_blocks_per_sm
    # at suite shapes a row fits one block: no cluster layouts there
    assert not [s for s in space(ir, SUITE) if s.cluster_blocks > 1]
    bad = replace(clustered[0], rows_per_block=2)
    assert is_valid(ir, bad, dims) == (
        False,
        "a cluster shares one row: one row per block, no persistent grid",
    )
    assert not is_valid(ir, replace(clustered[0], cluster_blocks=3), dims)[0]


def test_a_cluster_field_at_its_default_stays_out_of_the_dict_and_the_tag():
    s = Schedule(threads_per_row=512, chunks=2)
    assert "cluster_blocks" not in s.to_dict() and "cl" not in s.tag()
    c = replace(s, threads_per_row=4096, cluster_blocks=4)
    assert c.to_dict()["cluster_blocks"] == 4 and c.tag().startswith("ct4096r1v8c2")
    assert "cl4" in c.tag()
    assert Schedule.from_dict(c.to_dict()) == c and Schedule.from_dict(s.to_dict()) == s


def test_a_cluster_candidate_goes_into_a_batch_the_gpu_worker_accepts():
    # factory -> batch file -> gpuworker's parser: the cluster shape survives, the grid counts
    # blocks (a multiple of the cluster at every shape).
    from factory.agents.types import CandidateDraft
    from factory.emit import emit
    from factory.families.row.ir import lower
    from factory.loop import build_batch
    from factory.spec import eval_dim_expr, load_catalogue
    from gpuworker.batch import parse_batch

    w = load_catalogue()["softmax"]
    s = Schedule(threads_per_row=4096, chunks=2, cluster_blocks=4, mode="cached")
    em = emit(lower(w), s)
    draft = CandidateDraft(
        ptx=em.ptx, entry=em.entry, params=tuple(em.params), launch=em.launch,
        schedule=s.to_dict(), parent_ptx_sha256=None, role="writer", backend="offline",
        note="cluster row",
    )  # fmt: skip
    batch = parse_batch(build_batch(w, {"c1": draft}, baselines=(), options={}))
    (cand,) = batch.candidates
    assert cand.launch.cluster == (4, 1, 1) and cand.launch.block == (1024, 1, 1)
    for dims in [*batch.shapes, *batch.heldout_shapes]:
        assert eval_dim_expr(cand.launch.grid[0], dims) % 4 == 0


def test_late_stores_early_columns_and_moments_are_valid_only_where_they_mean_something():
    dims = {"M": 16384, "N": 4096}
    base = Schedule(threads_per_row=128, chunks=4)
    layernorm, add_rmsnorm, softmax = (
        EXAMPLES[n]() for n in ("layernorm", "add_rmsnorm", "softmax")
    )
    assert is_valid(add_rmsnorm, replace(base, late_stores=True), dims)[0]
    assert not is_valid(layernorm, replace(base, late_stores=True), dims)[0]  # one output, last
    assert not is_valid(add_rmsnorm, replace(base, late_stores=True, mode="stream"), dims)[0]
    assert is_valid(layernorm, replace(base, early_cols=True), dims)[0]
    assert not is_valid(softmax, replace(base, early_cols=True), dims)[0]  # no per-column input
    assert is_valid(layernorm, replace(base, moments=True), dims)[0]
    assert is_valid(layernorm, replace(base, moments=True, mode="stream", chunks=2), dims)[0]
    assert not is_valid(add_rmsnorm, replace(base, moments=True), dims)[0]  # no variance
    # At their defaults the fields stay out of the dict (earlier evidence keeps its keys) and
    # the tag; set, each adds its own letter.
    assert not {"late_stores", "early_cols", "moments"} & set(base.to_dict())
    tags = {replace(base, **{f: True}).tag() for f in ("late_stores", "early_cols", "moments")}
    assert len(tags | {base.tag()}) == 4
    assert any(s.moments for s in space(layernorm, [dims]))
    assert not any(s.moments for s in space(softmax, [dims]))


def test_multi_warp_row_groups_share_the_block_barrier_but_not_in_a_persistent_grid():
    from factory.emit import emit

    rms = lower(load_catalogue()["rmsnorm"])
    dims = {"M": 16384, "N": 4096}
    s = Schedule(threads_per_row=128, rows_per_block=2, chunks=4)
    assert is_valid(rms, s, dims)[0]
    ok, why = is_valid(rms, replace(s, persistent_blocks_per_sm=2), dims)
    assert not ok and "persistent" in why
    ptx = emit(rms, s).ptx
    # one barrier for the block (an immediate id), and stores that skip a group past the rows
    assert "bar.sync 0;" in ptx and not any("bar.sync %r" in ln for ln in ptx.splitlines())
    assert "min.u32" in ptx and any(
        ln.strip().startswith("@%p") and "st.global" in ln for ln in ptx.splitlines()
    )


@pytest.mark.parametrize(
    ("load_hint", "store_hint", "lq", "sq"),
    [
        ("nc_l2last", "l2first", "L1::evict_last.L2::cache_hint", "evict_first"),
        ("nc_l2first", "l2last", "L1::evict_first.L2::cache_hint", "evict_last"),
    ],
)
def test_l2_policy_hints_emit_a_policy_compile_and_have_their_own_tags(
    load_hint, store_hint, lq, sq
):
    from factory.compile import compile_ptx
    from factory.emit import emit

    ir = lower(load_catalogue()["rmsnorm"])
    base = Schedule(threads_per_row=128, chunks=4)
    s = replace(base, load_hint=load_hint, store_hint=store_hint)
    assert is_valid(ir, s, {"M": 16384, "N": 4096})[0]
    ptx = emit(ir, s).ptx
    assert f"ld.global.nc.{lq}.v4.b32" in ptx
    assert f"createpolicy.fractional.L2::{sq}.b64" in ptx
    assert "st.global.L2::cache_hint" in ptx
    report = compile_ptx(ptx, "sm_90")
    assert report.ok, report.log
    assert len({s.tag(), base.tag(), replace(base, store_hint="noalloc").tag()}) == 3


def test_column_groups_fence_the_weight_loads_and_free_registers():
    from factory.compile import compile_ptx
    from factory.emit import emit

    ln = lower(load_catalogue()["layernorm"])
    softmax = lower(load_catalogue()["softmax"])
    dims = {"M": 16384, "N": 8192}
    base = Schedule(threads_per_row=256, chunks=4, load_hint="nc")
    grouped = replace(base, col_groups=4)
    assert is_valid(ln, grouped, dims)[0]
    assert "col_groups" not in base.to_dict() and grouped.to_dict()["col_groups"] == 4
    assert grouped.tag() == base.tag().replace("_", "g4_")
    for bad, ir in (
        (replace(grouped, chunks=2), ln),  # 2 chunks do not split into 4 groups
        (replace(grouped, early_cols=True), ln),  # the columns come with the row then
        (replace(grouped, col_groups=3), ln),
        (replace(grouped, mode="stream"), ln),
        (grouped, softmax),  # no per-column input
    ):
        assert not is_valid(ir, bad, dims)[0], bad
    assert any(s.col_groups == 4 for s in space(ln, [dims]))
    assert not any(s.col_groups > 1 for s in space(softmax, [dims]))
    ptx = emit(ln, grouped).ptx
    assert ptx.count("fence.acq_rel.cta") == 3  # between 4 groups, on the whole-row path only
    # With the fences, ptxas keeps one group's weight and bias live instead of all four's:
    # fewer registers per thread, so four blocks of 256 fit on an SM (65536 registers) not three.
    plain, fenced = compile_ptx(emit(ln, base).ptx), compile_ptx(ptx)
    assert plain.ok and fenced.ok, plain.log + fenced.log
    assert fenced.spill_store_bytes == 0
    assert fenced.registers * 256 * 4 <= 65536 < plain.registers * 256 * 4


def _pass_loads(ptx: str) -> dict[int, list[str]]:
    """The global loads of each `// pass N` section of the whole-row (vector) path."""
    out: dict[int, list[str]] = {}
    p = None
    for ln in ptx.splitlines():
        s = ln.strip()
        if s.startswith("// pass "):
            p = int(s.split()[2].rstrip(":"))
        elif p is not None and "ld.global" in s and ".v4." in s:
            out.setdefault(p, []).append(s)
    return out


def test_reuse_hint_keeps_a_streamed_row_in_l2_until_its_last_read():
    from factory.compile import compile_ptx
    from factory.emit import emit

    rms = lower(load_catalogue()["rmsnorm"])
    dims = {"M": 16384, "N": 8192}
    s = Schedule(threads_per_row=512, chunks=2, mode="stream", load_hint="nc_l2reuse")
    assert is_valid(rms, s, dims)[0]
    assert s.tag().endswith("_lfno") and s.tag() != replace(s, load_hint="nc_l2last").tag()
    ok, why = is_valid(rms, replace(s, mode="cached"), dims)
    assert not ok and "stream" in why  # a cached row is read once
    ptx = emit(rms, s).ptx
    pol = {}
    for ln in ptx.splitlines():
        if "createpolicy" in ln:
            kind, reg = ln.split("L2::")[1].split(".b64 ")
            pol[kind] = reg.split(",")[0]
    assert set(pol) == {"evict_first", "evict_last"}
    loads = _pass_loads(ptx)
    # pass 0 (the sum of squares) reads x to read it again: evict-last; pass 1 (the stores)
    # reads x for the last time: evict-first; the weight keeps the read-only path
    assert loads[0] and all(
        "L1::evict_last.L2::cache_hint" in x and x.endswith(f"{pol['evict_last']};")
        for x in loads[0]
    )
    x1 = [x for x in loads[1] if "cache_hint" in x]
    assert len(x1) == 2 and all(
        "L1::evict_first" in x and x.endswith(f"{pol['evict_first']};") for x in x1
    )
    assert sum(x.startswith("ld.global.nc.v4") for x in loads[1]) == 2  # the weight, 2 chunks
    assert compile_ptx(ptx).ok
    assert any(x.load_hint == "nc_l2reuse" and x.mode == "stream" for x in space(rms, [dims]))


def test_column_hint_loads_per_column_vectors_with_the_evict_last_policy():
    rms = lower(load_catalogue()["rmsnorm"])
    softmax = lower(load_catalogue()["softmax"])
    dims = {"M": 16384, "N": 4096}
    base = Schedule(threads_per_row=128, chunks=4, load_hint="nc")
    held = replace(base, col_hint="nc_l2last")
    assert is_valid(rms, held, dims)[0]
    assert "col_hint" not in base.to_dict() and held.to_dict()["col_hint"] == "nc_l2last"
    assert held.tag() == base.tag().replace("_", "h_")
    assert not is_valid(softmax, held, dims)[0]  # no per-column input
    assert not is_valid(rms, replace(base, col_hint="l2"), dims)[0]
    from factory.emit import emit

    loads = [ln.strip() for ln in emit(rms, held).ptx.splitlines() if "ld.global" in ln]
    kept = [x for x in loads if "cache_hint" in x]
    # x keeps the plain read-only path; the weight is kept: 4 chunks on the whole-row path,
    # 2 per step on the streamed fallback for longer rows, and the scalar tail loads
    assert any(x.startswith("ld.global.nc.v4") for x in loads)
    assert sum(".v4." in x for x in kept) == 4 + 2
    assert all("L1::evict_last" in x for x in kept)


def test_plain_loads_with_the_evict_last_policy_leave_the_read_only_path():
    from factory.compile import compile_ptx
    from factory.emit import emit

    rms = lower(load_catalogue()["rmsnorm"])
    s = Schedule(threads_per_row=256, chunks=4, load_hint="plain_l2last")
    assert is_valid(rms, s, {"M": 16384, "N": 8192})[0]
    assert s.tag().endswith("_plno")
    ptx = emit(rms, s).ptx
    row = [ln.strip() for ln in ptx.splitlines() if "ld.global.L1::evict_last" in ln]
    assert row and all(x.endswith(";") and "L2::cache_hint" in x for x in row)
    assert "createpolicy.fractional.L2::evict_last.b64" in ptx
    assert compile_ptx(ptx).ok


def test_partial_accumulators_fold_by_trees_and_gathers_can_load_first():
    from factory.compile import compile_ptx
    from factory.emit import emit

    rms = lower(load_catalogue()["rmsnorm"])
    ce = lower(load_catalogue()["cross_entropy"])
    dims = {"M": 16384, "N": 8192}
    base = Schedule(threads_per_row=256, chunks=4)
    split = replace(base, acc_split=4)
    assert is_valid(rms, split, dims)[0]
    assert "acc_split" not in base.to_dict() and split.to_dict()["acc_split"] == 4
    assert split.tag() == base.tag().replace("_", "a4_")
    assert Schedule.from_dict(split.to_dict()) == split
    assert not is_valid(rms, replace(base, acc_split=3), dims)[0]
    assert not is_valid(rms, replace(base, chunks=1, vec_elems=8, acc_split=16), dims)[0]
    assert not is_valid(rms, replace(base, early_gather=True), dims)[0]  # nothing gathered

    def folds(s):
        """How many elements each accumulator register takes on the row's whole-row path."""
        lines = emit(rms, s).ptx.splitlines()
        start = next(i for i, ln in enumerate(lines) if "// pass 0" in ln)
        end = next(i for i, ln in enumerate(lines) if ln.startswith("$L_p0_tail"))
        acc = [ln.split()[1] for ln in lines[start:end] if ln.strip().startswith("add.f32")]
        return sorted(acc.count(r) for r in set(acc) if acc.count(r) > 1)

    # one accumulator: 32 dependent adds per thread into one register; four: eight each
    assert folds(base) == [32]
    assert folds(split) == [8, 8, 8, 8]
    assert compile_ptx(emit(rms, split).ptx).ok

    s = Schedule(
        threads_per_row=32,
        rows_per_block=2,
        chunks=4,
        mode="stream",
        online=True,
        fast_math=False,
        load_hint="nc",
    )
    early = replace(s, early_gather=True)
    assert is_valid(ce, early, {"M": 4096, "V": 32000})[0] and early.tag().endswith("q_nlno")

    def first_loop_line(ptx, needle):
        lines = ptx.splitlines()
        loop = next(i for i, ln in enumerate(lines) if ln.startswith("$L_p0_loop"))
        hits = [i for i, ln in enumerate(lines) if needle in ln]
        return loop, hits

    # the gathered logit (a 2-byte load at the target's column) comes before the row's loop
    # with early_gather, after it without
    loop, hits = first_loop_line(emit(ce, early).ptx, "ld.global.b16")
    assert hits and all(h < loop for h in hits)
    loop, hits = first_loop_line(emit(ce, s).ptx, "ld.global.b16")
    assert hits and all(h > loop for h in hits)
    assert compile_ptx(emit(ce, replace(early, acc_split=4)).ptx).ok


def test_packed_max_is_for_online_pairs_over_16_bit_row_inputs():
    from factory.compile import compile_ptx
    from factory.emit import emit

    ce = lower(load_catalogue()["cross_entropy"])
    masked = lower(load_catalogue()["masked_softmax"])
    dims = {"M": 4096, "V": 32000}
    s = Schedule(
        threads_per_row=32, chunks=8, mode="stream", online=True, fast_math=False,
        min_threads_per_sm=1024,
    )  # fmt: skip
    packed = replace(s, packed_max=True)
    assert is_valid(ce, packed, dims)[0] and packed.tag().endswith("b_nlno")
    assert packed.to_dict()["packed_max"] and "packed_max" not in s.to_dict()
    assert not is_valid(ce, replace(packed, online=False), dims)[0]
    # the masked softmax's F is x plus the mask, not a row input read as it is
    assert not is_valid(masked, replace(packed), {"M": 64, "N": 4096})[0]
    # eight chunks of loads in flight under a 64-register cap: without packed_max ptxas spills
    # (every element of a group live as f32, the tail's included); with it, it does not
    assert compile_ptx(emit(ce, s).ptx).spill_store_bytes > 0
    rep = compile_ptx(emit(ce, packed).ptx)
    assert rep.ok and rep.registers <= 64 and rep.spill_store_bytes == 0
    assert emit(ce, packed).ptx.count("max.bf16x2") == 8 * 4 - 1


def test_the_tail_is_fitted_to_the_rows_that_take_it():
    rms = lower(load_catalogue()["rmsnorm"])
    ce = lower(load_catalogue()["cross_entropy"])
    cached = Schedule(threads_per_row=128, chunks=4, load_hint="nc_l2last")  # 4096 a row
    assert not tail_runs(rms, cached, {"M": 16384, "N": 4096})  # whole chunks only
    assert tail_runs(rms, cached, {"M": 16384, "N": 4000})  # under the capacity
    assert not tail_runs(rms, cached, {"M": 16384, "N": 4001})  # no whole vectors to move
    streamed = Schedule(threads_per_row=32, rows_per_block=2, chunks=4, mode="stream", online=True)
    assert tail_runs(ce, streamed, {"M": 4096, "V": 32000})  # 31 steps of 1024, then 256
    assert not tail_runs(ce, streamed, {"M": 4096, "V": 32768})
    # the default and every point of the space carry the tail their shapes need
    assert default_schedule(ce, {"M": 4096, "V": 32000}).tail == "vectors"
    assert default_schedule(rms, {"M": 16384, "N": 4096}).tail == "elements"
    odd = default_schedule(rms, {"M": 16384, "N": 4999})
    assert odd.tail == "strided" and odd.tag().endswith("z_elno")
    # streamed rows are walked from the aligned address before them (strided was slower for
    # cross-entropy there, shifted 1.1-1.5x faster)
    assert default_schedule(ce, {"M": 4096, "V": 50257}).tail == "shifted"
    s = default_schedule(rms, {"M": 16384, "N": 5000})
    assert s.tail == "vectors" and s.tag().endswith("u_elno") and s.to_dict()["tail"] == "vectors"
    assert "tail" not in replace(s, tail="elements").to_dict()
    assert not is_valid(rms, replace(s, tail="rows"), {"M": 16384, "N": 5000})[0]
    both = [{"M": 16384, "N": 4096}, {"M": 16384, "N": 4000}]
    assert fit_tail(rms, cached, both).tail == "vectors"
    assert fit_tail(rms, cached, both[:1]).tail == "elements"
    pts = space(rms, both)
    assert pts and all((p.tail == "vectors") == tail_runs(rms, p, both[1]) for p in pts)


@pytest.mark.parametrize(
    "name", ["rmsnorm", "add_rmsnorm", "layernorm", "softmax", "silu_mul", "gelu_tanh"]
)
def test_the_vector_and_strided_tails_move_what_they_say_and_compile_without_spills(name):
    from factory.compile import compile_ptx
    from factory.emit import emit

    ir = lower(load_catalogue()[name])
    s = default_schedule(ir, {"M": 16384, "N": 5000})
    assert s.tail == "vectors"
    vec, elems = emit(ir, s).ptx, emit(ir, replace(s, tail="elements")).ptx
    strided = emit(ir, replace(s, tail="strided")).ptx

    def guarded(ptx: str, what: str) -> int:
        return sum(1 for ln in ptx.splitlines() if ln.lstrip().startswith("@%p") and what in ln)

    # predicated 16-byte loads and stores appear only with "vectors"; the element tail stays
    assert guarded(vec, ".v4.") > 0 and guarded(elems, ".v4.") == guarded(strided, ".v4.") == 0
    assert guarded(vec, "ld.global") > guarded(elems, "ld.global") > 0
    assert guarded(vec, ".b16 [") == guarded(elems, ".b16 [") > 0  # element-by-element stores
    # strided: element j of a chunk T elements on (T * 2 bytes), not the next element
    t2 = 2 * s.threads_per_row
    assert f"+{t2}];" in strided.replace("], %rd", "];") and f"+{t2}]" not in elems
    for ptx in (vec, strided):
        rep = compile_ptx(ptx)
        assert rep.ok and rep.spill_store_bytes == 0 and rep.stack_bytes == 0, rep


def test_elementwise_rows_of_an_odd_length_are_walked_as_one_run_of_tiles():
    from factory.compile import compile_ptx
    from factory.emit import emit
    from factory.spec import eval_dim_expr

    silu = lower(load_catalogue()["silu_mul"])
    rms = lower(load_catalogue()["rmsnorm"])
    odd = {"M": 16384, "N": 4999}
    s = default_schedule(silu, odd)
    assert s.flat and s.tail == "elements" and "j_" in s.tag() and is_valid(silu, s, odd)[0]
    assert not default_schedule(silu, {"M": 16384, "N": 5000}).flat  # whole vectors there
    assert default_schedule(rms, odd).tail == "strided" and not default_schedule(rms, odd).flat
    assert not is_valid(rms, replace(default_schedule(rms, odd), flat=True), odd)[0]
    assert not is_valid(silu, replace(s, rows_per_block=2), odd)[0]
    em = emit(silu, s)
    tile = s.threads_per_row * s.vec_elems * s.chunks
    assert eval_dim_expr(em.launch.grid[0], odd) == -(-16384 * 4999 // tile)
    assert "long_row" not in em.ptx  # a tile always fits the registers
    rep = compile_ptx(em.ptx)
    assert rep.ok and rep.spill_store_bytes == 0 and rep.stack_bytes == 0
    from factory.families.row.seeds import candidate_schedules

    assert all(c.flat for c in candidate_schedules(silu, odd))


def test_the_default_takes_the_fewest_chunks_that_cover_the_row():
    ir = lower(load_catalogue()["rmsnorm"])
    layout = {
        n: (s.threads_per_row, s.chunks, s.tail)
        for n in (4096, 8192, 3072, 5000, 768, 100, 120)
        for s in [default_schedule(ir, {"M": 64, "N": n})]
    }
    assert layout[4096] == (128, 4, "elements")  # powers of two: as before
    assert layout[8192] == (256, 4, "elements")
    assert layout[3072] == (128, 3, "elements")  # filled, where 4 chunks left a quarter idle
    assert layout[5000] == (256, 3, "vectors")  # 6144 places for 5000, not 8192
    assert layout[768] == (32, 3, "elements")
    # a short row: 16 threads, two rows a warp; whole vectors in registers, any other row
    # streamed (no element tail in registers)
    assert layout[120] == (16, 1, "stream")
    # a short row off a 16-byte boundary (200 bytes): 8 threads of four 8-byte chunks
    assert layout[100] == (8, 4, "stream")
    # an elementwise row walked as tiles keeps the power-of-two tile
    silu = lower(load_catalogue()["silu_mul"])
    s = default_schedule(silu, {"M": 64, "N": 4999})
    assert s.flat and (s.threads_per_row, s.chunks) == (256, 4)


def test_the_space_holds_chunk_counts_other_than_powers_of_two_only_where_they_fit_a_row():
    ir = lower(load_catalogue()["rmsnorm"])
    odd = {1, 2, 4, 8}
    plain = {s.chunks for s in space(ir, [{"M": 64, "N": 4096}])}
    assert plain == odd
    ragged = space(ir, [{"M": 64, "N": 3072}])
    extra = {(s.threads_per_row, s.vec_elems, s.chunks) for s in ragged if s.chunks not in odd}
    assert (128, 8, 3) in extra and (64, 8, 6) in extra  # 3072 = 128 x 3 x 8 = 64 x 6 x 8
    assert all(-(-3072 // (t * v)) == c for t, v, c in extra)


def test_misaligned_streamed_rows_are_walked_shifted_and_rows_in_registers_strided():
    cat = load_catalogue()
    ce = lower(cat["cross_entropy"])
    odd = [{"M": 4096, "V": 50257}]
    assert default_schedule(ce, odd[0]).tail == "shifted"
    sp = space(ce, odd)
    shifted = [s for s in sp if s.tail == "shifted"]
    # the tail's letter ends the layout, or comes before the split's "i"
    assert shifted and all(s.tag().split("_")[0].removesuffix("i")[-1] == "y" for s in shifted)
    # every streamed point that can walk shifted does; the rest keep consecutive elements
    streamed = [s for s in sp if s.mode == "stream"]
    assert all((s.tail == "shifted") == shift_ok(ce, s) for s in streamed)
    assert any(s.tail == "elements" and s.cluster_blocks > 1 for s in streamed)
    assert not any(s.tail == "shifted" for s in space(ce, [{"M": 4096, "V": 50000}]))
    # rows held in registers too, a norm's weight included; the window of N + up to 7
    # elements must fit the registers: 4999 fits 128 threads x 5 chunks x 8, 5115 does not
    rms = lower(cat["rmsnorm"])
    s5 = Schedule(threads_per_row=128, chunks=5, tail="shifted")
    assert is_valid(rms, s5, {"M": 8, "N": 4999})[0]
    assert "capacity 5113" in is_valid(rms, s5, {"M": 8, "N": 5115})[1]
    rms_space = space(rms, [{"M": 8, "N": 4999}])
    cached = [s for s in rms_space if s.mode == "cached" and not s.flat]
    assert {s.tail for s in cached} == {"strided", "shifted"}
    twins = [s for s in cached if s.tail == "shifted"]  # each beside its fitted twin
    held = set(cached)
    assert twins and all(replace(s, tail="strided") in held for s in twins)
    assert default_schedule(rms, {"M": 8, "N": 4999}).tail == "strided"  # faster on the H200
    # the twin only where the row and the up to V - 1 elements before it fit the registers
    assert all(is_valid(rms, s, {"M": 8, "N": 2047})[0] for s in space(rms, [{"M": 8, "N": 2047}]))
    # never with the one-pass mean and variance, a prefetched row or tiles
    ln = lower(cat["layernorm"])
    assert is_valid(ln, s5, {"M": 8, "N": 4999})[0]
    assert not is_valid(ln, replace(s5, moments=True), {"M": 8, "N": 4999})[0]
    prefetch = replace(s5, prefetch_rows=True, persistent_blocks_per_sm=2, min_threads_per_sm=256)
    assert not is_valid(rms, prefetch, {"M": 8, "N": 4999})[0]


def test_rows_that_take_a_tail_get_the_split_kernel_too_and_full_rows_do_not():
    ln = lower(load_catalogue()["layernorm"])
    job = [{"M": 16384, "N": 5000}]
    tight = fit_tail(ln, Schedule(threads_per_row=128, chunks=5), job)  # 5120 for rows of 5000
    twin = split_twin(ln, tight, job)
    assert twin == replace(tight, split_paths=True)
    assert split_twin(ln, twin, job) is None  # no twin of a twin
    full = [{"M": 16384, "N": 4096}]
    assert split_twin(ln, Schedule(threads_per_row=128, chunks=4), full) is None  # no tail
    assert split_twin(ln, Schedule(threads_per_row=128, chunks=4, mode="stream"), job) is None
    # The space holds a split twin beside every register-held layout whose rows take a tail,
    # and none where every row fills its layout exactly.
    sp = space(ln, job)
    joined = {s for s in sp if not s.split_paths}
    split = [s for s in sp if s.split_paths]
    assert split and all(replace(s, split_paths=False) in joined for s in split)
    assert all(s.mode == "cached" and not s.flat and not s.prefetch_rows for s in split)
    assert tight in joined and twin in split
    exact = [
        s
        for s in space(ln, full)
        if s.mode == "cached" and s.threads_per_row * s.vec_elems * s.chunks == 4096
    ]
    assert exact and not any(s.split_paths for s in exact)


def test_the_seed_layouts_split_the_tight_layout_at_odd_widths_only():
    from factory.families.row.seeds import candidate_schedules

    ln = lower(load_catalogue()["layernorm"])
    odd = candidate_schedules(ln, {"M": 16384, "N": 5000})
    # the H200's fastest LayerNorm at 16384x5000: 128 threads of 5 chunks, split, capped at 768
    assert replace(odd[0], split_paths=True, min_threads_per_sm=768) in odd
    assert not any(s.split_paths for s in candidate_schedules(ln, {"M": 16384, "N": 4096}))


def test_a_shifted_twin_gets_its_own_register_cap_where_its_layouts_spilled():
    """add+RMSNorm at 16384x4999: 128 threads of 5 chunks with the weight loaded early, capped
    for 512 threads an SM, spills strided and compiles clean shifted (so did LayerNorm's
    fastest layout there on the H200, capped for 768, before its columns moved as words). The
    seeds carry the shifted one, and count the twins of a layout as one layout."""
    from factory.compile import compile_ptx, rejection_reason
    from factory.emit import emit
    from factory.families.row.seeds import CANDIDATES_PER_SHAPE, candidate_schedules

    ar = lower(load_catalogue()["add_rmsnorm"])
    dims = {"M": 16384, "N": 4999}
    seeds = candidate_schedules(ar, dims)
    assert (seeds[0].threads_per_row, seeds[0].chunks, seeds[0].tail) == (128, 5, "strided")
    shifted = next(s for s in seeds if s.tail == "shifted" and s.min_threads_per_sm)
    capped = replace(shifted, tail="strided")
    assert rejection_reason(compile_ptx(emit(ar, capped).ptx), 128)  # spills strided
    assert not rejection_reason(compile_ptx(emit(ar, shifted).ptx), 128)
    assert capped not in seeds and replace(capped, min_threads_per_sm=0) in seeds
    layouts = {replace(s, tail="elements", col_groups=1) for s in seeds}
    assert len(layouts) == CANDIDATES_PER_SHAPE < len(seeds)


def test_a_split_twin_is_valid_wherever_its_joined_layout_is():
    # split_twin skips the validity pass: is_valid must judge the two alike.
    import random

    rng = random.Random(7)
    cat = load_catalogue()
    for op, job in [("layernorm", [{"M": 64, "N": 5000}]), ("softmax", [{"M": 8, "N": 4999}])]:
        ir = lower(cat[op])
        sp = space(ir, job)
        for s in rng.sample([s for s in sp if s.split_paths], 200):
            joined = replace(s, split_paths=False)
            assert fits_job(ir, s, job) and fits_job(ir, joined, job)


def test_columns_one_chunk_at_a_time_where_four_groups_do_not_divide_the_chunks():
    # At 4999 columns the tight layout is 128 threads of 5 chunks: 4 groups cannot split it, so
    # the space offers 5 (one chunk at a time) instead; the seeds put that grouping on the
    # shifted twin (LayerNorm 128 -> 80 registers; 4% and 9% faster on the H100 for LayerNorm
    # and RMSNorm). Rows of whole 4-chunk layouts keep their 4 groups and seeds as before.
    from factory.families.row.seeds import candidate_schedules

    ln = lower(load_catalogue()["layernorm"])
    odd = {"M": 16384, "N": 4999}
    five = [s for s in space(ln, [odd]) if s.chunks == 5 and s.mode == "cached"]
    assert {s.col_groups for s in five} == {1, 5}
    tight = next(s for s in five if s.col_groups == 1 and not s.early_cols)
    assert is_valid(ln, replace(tight, col_groups=5), odd)[0]
    assert not is_valid(ln, replace(tight, col_groups=3), odd)[0]
    assert not is_valid(ln, replace(tight, col_groups=4), odd)[0]
    for name in ("layernorm", "rmsnorm"):
        ir = lower(load_catalogue()[name])
        seeds = candidate_schedules(ir, odd)
        grouped = [s for s in seeds if s.col_groups == s.chunks > 1]
        assert grouped and all(s.tail == "shifted" and not s.early_cols for s in grouped)
        assert replace(grouped[0], col_groups=1) in seeds
        aligned = candidate_schedules(ir, {"M": 16384, "N": 4096})
        assert not any(s.col_groups > 1 for s in aligned)


def test_a_shifted_rows_whole_chunks_load_unpredicated_and_skip_the_element_predicates():
    # Only the one or two chunks a row that straddle its ends are not whole: the others branch
    # to plain 16-byte loads (and words for the columns) and never compute per-element
    # predicates or zero their registers (LayerNorm 16384x4999 on the H100: 126.0 -> 117.2 us,
    # bench/results/2026-12-05-h100-shiftpreds)
    import re

    from factory.emit import emit

    ln = lower(load_catalogue()["layernorm"])
    s = Schedule(threads_per_row=128, chunks=5, col_groups=5, load_hint="nc_l2last", tail="shifted")
    assert is_valid(ln, s, {"M": 16384, "N": 4999})[0]
    ptx = emit(ln, s).ptx
    assert not re.search(r"@!?%p\d+ ld\.global\S*\.v4", ptx)  # no predicated 16-byte load
    steps = re.findall(r"@!(%p\d+) bra (\$L_shift_elems_\d+);\n(.*?)\n\2:", ptx, re.S)
    # the row's 5 chunks as it is loaded, its columns' 5 in the output pass, and the steps of
    # the streamed path (rows past the registers' capacity)
    assert len(steps) >= 10
    for _, _, whole_path in steps:
        assert "ld.global" in whole_path and "setp" not in whole_path


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm", "cross_entropy"])
def test_rows_under_a_warp_take_fewer_threads_and_share_warps(name):
    # A row of 64 or 128 bf16 (a router's softmax over 64 experts, a norm over a 128-wide head)
    # fills under half of a warp's 16-byte chunks: the space was empty there. Rows of 129-256
    # take 8 threads of up to four chunks each (2026-12-06-h100-shortrows2).
    from factory.compile import compile_ptx
    from factory.emit import emit

    ir = lower(load_catalogue()[name])
    # (rows of 100 and 20 bf16, off a 16-byte boundary, take 8-byte chunks, four a thread)
    # (rows of 129-256 take 8 threads of up to four 16-byte chunks)
    short = [(64, 8, 1), (128, 16, 1), (100, 8, 4), (20, 4, 2)]
    for n, t, c in short + [(200, 8, 4), (160, 8, 3), (256, 8, 4)]:
        dims = {ir.batch_dims[0]: 65536, ir.row_dim: n}
        if n == 64:
            sp = space(ir, [dims])
            assert sp and all(s.threads_per_row < 32 for s in sp)
            assert all(s.mode == "cached" for s in sp)
            # (a row loop in a persistent grid is valid, the warp leaving it as one, but was
            # slower everywhere it was timed: not searched)
            assert not any(s.persistent_blocks_per_sm for s in sp)
            assert all(s.threads_per_block % 32 == 0 for s in sp)
        s = default_schedule(ir, dims)
        assert (s.threads_per_row, s.chunks, s.threads_per_block) == (t, c, 128)
        assert s.vec_elems == (4 if n % 8 else 8)
        assert is_valid(ir, s, dims)[0]
        em = emit(ir, s)
        assert em.launch.block == (128, 1, 1)
        # a butterfly over the row's own lanes only: no shuffle across rows
        offsets = {int(ln.split(",")[2]) for ln in em.ptx.splitlines() if "shfl.sync.bfly" in ln}
        assert offsets == {o for o in (16, 8, 4, 2, 1) if o < t}
        rep = compile_ptx(em.ptx)
        assert rep.ok and not rep.spill_store_bytes
    # a row past one round of a warp's chunks keeps a warp or more
    long = {ir.batch_dims[0]: 65536, ir.row_dim: 4096}
    wide = replace(default_schedule(ir, long), threads_per_row=16, rows_per_block=2, mode="cached")
    ok, why = is_valid(ir, wide, long)
    assert not ok and "a warp or more" in why
    assert all(
        s.threads_per_row >= 32 for s in space(ir, [{ir.batch_dims[0]: 64, ir.row_dim: 257}])
    )
    # a row of 200 holds both: under a warp, and a warp of one chunk (the default until then)
    widths = {s.threads_per_row for s in space(ir, [{ir.batch_dims[0]: 64, ir.row_dim: 200}])}
    assert {8, 16, 32} <= widths


def test_short_rows_off_a_16_byte_boundary_also_take_8_byte_chunks():
    # 100 bf16 = 200 bytes: every other row starts 8 bytes past a 16-byte boundary, so 16-byte
    # chunks walk it with the strided tail (2-byte loads); 8-byte chunks start every row aligned
    from factory.families.row.schedules import narrow_vec

    ir = lower(load_catalogue()["layernorm"])
    for n, want in [(100, 4), (36, 4), (128, 0), (96, 0), (98, 0), (4100, 0)]:
        dims = [{"M": 4096, "N": n}]
        assert narrow_vec(ir, dims) == want, n
        vecs = {s.vec_elems for s in space(ir, dims)}
        assert (4 in vecs) == bool(want), n
    assert narrow_vec(ir, [{"M": 64, "N": 100}, {"M": 64, "N": 96}]) == 4
    # 200 bf16: past the rows 8-byte chunks were timed at
    assert narrow_vec(ir, [{"M": 64, "N": 100}, {"M": 64, "N": 200}]) == 0
    narrow = [s for s in space(ir, [{"M": 4096, "N": 100}]) if s.vec_elems == 4]
    # under a warp: whole vectors in registers, other rows streamed; a warp a row: "vectors"
    assert all(s.tail == ("stream" if s.threads_per_row < 32 else "vectors") for s in narrow)


def test_rows_under_a_warp_need_whole_warps_and_leave_a_row_loop_as_one():
    from factory.emit import emit
    from factory.emit.ptx import EmitError

    ir = lower(load_catalogue()["rmsnorm"])
    dims = {"M": 4096, "N": 64}
    s = default_schedule(ir, dims)
    for bad, word in [
        (replace(s, rows_per_block=2), "whole warps"),
        (replace(s, mode="stream"), "cached"),
        (replace(s, tail="shifted", prefetch_rows=True, persistent_blocks_per_sm=2), "prefetch"),
    ]:
        ok, why = is_valid(ir, bad, dims)
        assert not ok and word in why, why
    with pytest.raises(EmitError, match="whole warps"):
        emit(ir, replace(s, rows_per_block=2))
    # In a persistent grid the warp loops while its first row is a row: the exit test reads
    # the warp's first row, and every later group works on a clamped row with stores off.
    loop = replace(s, persistent_blocks_per_sm=2, prefetch_rows=True, early_cols=True)
    assert is_valid(ir, loop, dims) == (True, "")
    ptx = emit(ir, loop).ptx
    assert "the warp's first row: all its lanes leave the loop together" in ptx
    assert "per-column vectors, held in registers across every row" in ptx
    # without prefetch, early_cols still holds the columns across rows; with a warp per row
    # (one row group a warp) early_cols and prefetch stay exclusive
    assert "held in registers across" in emit(ir, replace(loop, prefetch_rows=False)).ptx
    long = {"M": 4096, "N": 4096}
    wide = replace(default_schedule(ir, long), persistent_blocks_per_sm=2, prefetch_rows=True)
    assert not is_valid(ir, replace(wide, early_cols=True), long)[0]


def test_rows_under_a_warp_hold_no_element_tail_in_registers():
    # The "stream" tail: a row of whole vectors in registers, any other row streamed. The
    # element tail was what set a short row's register count.
    from factory.compile import compile_ptx
    from factory.emit import emit

    for name in ("layernorm", "rmsnorm", "softmax"):
        ir = lower(load_catalogue()[name])
        dims = {"M": 1048576, "N": 100}
        s = default_schedule(ir, dims)
        assert s.tail == "stream" and s.split_paths and is_valid(ir, s, dims)[0]
        s = replace(s, split_paths=False)  # (the paths joined: the tail is in every pass)
        ours = compile_ptx(emit(ir, s).ptx)
        before = compile_ptx(emit(ir, replace(s, tail="vectors")).ptx)
        assert ours.ok and not ours.spill_store_bytes
        assert ours.registers < before.registers, name
    # rows that are not all whole vectors keep their tail; streamed rows cannot take it
    ir = lower(load_catalogue()["rmsnorm"])
    assert default_schedule(ir, {"M": 64, "N": 37}).tail != "stream"
    s = default_schedule(ir, {"M": 64, "N": 64})
    ok, why = is_valid(ir, replace(s, mode="stream"), {"M": 64, "N": 64})
    assert not ok


def test_the_space_skips_only_layouts_that_no_row_of_the_job_fits(monkeypatch):
    # _build_space skips a (threads, vector, chunks, mode) whose capacity every row of the job
    # overflows or fills under half before constructing its variants; the space must be the
    # same point for point as building every variant and asking fits_job
    from factory.families.row import schedules as S

    cases = [
        ("rmsnorm", [{"M": 64, "N": 128}]),  # rows under a warp: most pairs never fit
        ("layernorm", [{"M": 64, "N": 36}]),  # 8-byte chunks too
        ("silu_mul", [{"M": 64, "N": 4999}]),
        ("cross_entropy", [{"M": 4096, "V": 32000}, {"M": 64, "V": 1000}]),  # streamed
    ]
    cat = load_catalogue()
    fast = {name: S._build_space(lower(cat[name]), dims) for name, dims in cases}
    monkeypatch.setattr(S, "_never_fits", lambda *a: False)
    for name, dims in cases:
        full = S._build_space(lower(cat[name]), dims)
        assert full == fast[name] and full, name


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "softmax"])
def test_rows_of_a_warp_or_less_load_without_an_l2_policy(name):
    # (faster on an H100 at rows of 100 and 1000 in every layout timed both ways; the suite's
    # longer rows keep the evict-last policy, which won there on the H200)
    ir = lower(load_catalogue()[name])
    for n, threads, hint in [(100, 8, "nc"), (1000, 32, "nc"), (4096, 128, "nc_l2last")]:
        s = default_schedule(ir, {ir.batch_dims[0]: 65536, ir.row_dim: n})
        assert (s.threads_per_row, s.mode, s.load_hint) == (threads, "cached", hint)


def test_short_rows_search_and_seed_two_rows_a_thread():
    """Rows a warp or less holds: the space also holds each cached layout of 32 threads or fewer
    (one row group a block) with two rows a thread, and the seeds hold one such layout where a
    thread holds at most two chunks (16 threads at 200 columns, a warp at 512); rows past a
    warp's reach (4096) and layouts of more than a warp get none."""
    from factory.families.row.seeds import candidate_schedules

    for name in ("layernorm", "softmax"):
        ir = lower(load_catalogue()[name])
        short = space(ir, [{"M": 131072, "N": 200}])
        two = [s for s in short if s.rows_per_thread == 2]
        assert two and all(
            s.threads_per_row <= 32 and s.mode == "cached" and not s.persistent_blocks_per_sm
            for s in two
        )
        assert {s.threads_per_row for s in two} >= {8, 16, 32}
        assert all(s.rows_per_thread == 1 for s in space(ir, [{"M": 16384, "N": 4096}]))
        seeds = {
            n: [s.tag() for s in candidate_schedules(ir, {"M": 131072, "N": n})]
            for n in (200, 512, 1000)
        }
        assert "ct16r8v8c2s2ni_nlno" in seeds[200], seeds[200]
        assert "ct32r2v8c2s2_nlno" in seeds[512], seeds[512]
        assert not any("s2" in t for t in seeds[1000]), seeds[1000]
    # an elementwise row that 32-byte chunks leave misaligned is walked as tiles where a layout
    # may (one row a thread); its two-rows layouts keep rows, each fitted and valid
    ir = lower(load_catalogue()["gelu_tanh"])
    job = [{"M": 4096, "N": 1000}]
    sp = space(ir, job)
    assert any(s.flat for s in sp) and any(s.rows_per_thread == 2 for s in sp)
    assert all(fits_job(ir, s, job) for s in sp if s.rows_per_thread == 2 or s.flat)
