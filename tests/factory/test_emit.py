"""PTX emission (CPU only): every example operator and schedule family renders, compiles with
nvJitLink without local memory, carries its binding, and the catalogue's PTX matches the golden
files (regenerate with UPDATE_GOLDEN=1)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_ir_examples import EXAMPLES  # noqa: E402

from factory import families as family_registry  # noqa: E402
from factory.compile import compile_ptx, rejection_reason  # noqa: E402
from factory.emit import EmitError, emit  # noqa: E402
from factory.families.row.ir import ROLE_ROW, OutputRef, TensorRef, lower_nodes  # noqa: E402
from factory.families.row.schedules import Schedule, default_schedule  # noqa: E402
from factory.spec import expr as E  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
DIMS = {"M": 16384, "N": 4096}


def families(ir) -> dict[str, Schedule]:
    """One schedule per layout family the emitter has."""
    base = default_schedule(ir, DIMS)
    out = {
        "cached_block": base,
        "cached_warp_rows": replace(base, threads_per_row=32, rows_per_block=4, chunks=8),
        "cached_persistent": replace(base, persistent_blocks_per_sm=4, load_hint="evict_first"),
        "stream": replace(base, mode="stream", threads_per_row=256, chunks=2, store_hint="cs"),
        "narrow_vectors": replace(base, vec_elems=base.vec_elems // 2, threads_per_row=256),
        "cached_prefetch": replace(
            base, prefetch_rows=True, persistent_blocks_per_sm=2, min_threads_per_sm=256
        ),
        "cached_recompute": replace(base, keep_intermediates=False),
    }
    if ir.online:
        out["stream_online"] = replace(base, mode="stream", online=True, threads_per_row=512)
        out["cached_online"] = replace(base, online=True)
    return out


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_example_compiles_in_every_family_without_local_memory(name):
    ir = EXAMPLES[name]()
    for fam, s in families(ir).items():
        em = emit(ir, s)
        rep = compile_ptx(em.ptx)
        assert rep.ok, (fam, rep.log[:500])
        assert rejection_reason(rep, s.threads_per_block) == "", (fam, rep.to_dict())


def test_the_default_schedules_have_no_spills_at_the_suite_shapes():
    for name in ("softmax", "layernorm", "add_rmsnorm", "silu_mul", "gelu_tanh"):
        ir = EXAMPLES[name]()
        for n in (4096, 8192):
            s = default_schedule(ir, {"M": 16384, "N": n})
            rep = compile_ptx(emit(ir, s).ptx)
            assert rep.ok and rep.spill_store_bytes == 0 and rep.stack_bytes == 0, (name, n)
    ir = EXAMPLES["cross_entropy"]()
    for n in (32000, 128256):
        s = default_schedule(ir, {"M": 4096, "N": n})
        rep = compile_ptx(emit(ir, s).ptx)
        assert rep.ok and rep.spill_store_bytes == 0 and rep.stack_bytes == 0, n


def test_it_also_compiles_for_blackwell():
    ir = EXAMPLES["layernorm"]()
    em = emit(ir, default_schedule(ir, DIMS), arch="sm_100")
    assert ".target sm_100" in em.ptx
    assert compile_ptx(em.ptx, arch="sm_100").ok


def test_the_vector_path_and_the_tail_path_are_both_emitted():
    ir = EXAMPLES["softmax"]()
    ptx = emit(ir, default_schedule(ir, DIMS)).ptx
    assert re.search(r"ld\.global\.nc[.\w:]*\.v4\.b32", ptx), "16-byte loads"
    assert re.search(r"st\.global\.v4\.b32", ptx), "16-byte stores"
    assert re.search(r"@%p\d+ ld\.global[.\w:]*\.b16", ptx), "predicated tail loads"
    assert re.search(r"@%p\d+ st\.global\.b16", ptx), "predicated tail stores"
    assert "setp.gt.u32" in ptx and "long_row" in ptx, "rows past the capacity stream"
    assert "ex2.approx.ftz.f32" in ptx and "shfl.sync.bfly.b32" in ptx


def test_the_online_pair_folds_max_and_sum_into_one_pass():
    ir = EXAMPLES["cross_entropy"]()
    s = replace(default_schedule(ir, {"M": 4096, "N": 128256}), mode="stream", online=True)
    ptx = emit(ir, s).ptx
    assert ptx.count("online max/sum over this group") >= 2  # fast and tail paths
    assert ptx.count("pass 0") >= 1 and "pass 1" not in ptx


def test_the_binding_names_every_tensor_and_dim_and_the_launch_covers_the_rows():
    ir = EXAMPLES["add_rmsnorm"]()
    s = replace(default_schedule(ir, DIMS), rows_per_block=2)
    em = emit(ir, s)
    assert [(p.kind, p.name) for p in em.params] == [
        ("tensor", "x"),
        ("tensor", "r"),
        ("tensor", "w"),
        ("tensor", "h"),
        ("tensor", "y"),
        ("dim", "M"),
        ("dim", "N"),
    ]
    assert em.launch.grid == ("ceildiv(M, 2)", 1, 1)
    assert em.launch.block == (s.threads_per_row * 2, 1, 1)
    assert f".visible .entry {em.entry}(" in em.ptx
    persistent = emit(ir, replace(s, persistent_blocks_per_sm=3)).launch
    assert persistent.grid[0] == "min(ceildiv(M, 2), 396)"


def test_multiple_batch_dims_are_flattened_into_rows():
    x = E.Input("x", ("B", "T", "N"), "bf16")
    y = E.Unary("neg", x, ("B", "T", "N"))
    ir = lower_nodes(
        name="neg3d",
        batch_dims=("B", "T"),
        row_dim="N",
        inputs=(TensorRef("x", "bf16", ROLE_ROW),),
        outputs=(OutputRef("y", "bf16", ROLE_ROW, y),),
    )
    em = emit(ir, default_schedule(ir, {"B": 4, "T": 8, "N": 1024}))
    assert em.launch.grid[0] == "ceildiv(B*T, 4)"
    assert compile_ptx(em.ptx).ok


def test_what_cannot_be_rendered_is_an_explicit_error():
    ir = EXAMPLES["softmax"]()
    with pytest.raises(EmitError, match="family"):
        emit(ir, replace(default_schedule(ir, DIMS), family="tiles"))
    with pytest.raises(EmitError, match="sm_80"):
        emit(ir, default_schedule(ir, DIMS), arch="sm_80")
    x = E.Input("x", ("M", "N"), "int64")
    bad = lower_nodes(
        name="wide",
        batch_dims=("M",),
        row_dim="N",
        inputs=(TensorRef("x", "int64", ROLE_ROW),),
        outputs=(OutputRef("y", "fp32", ROLE_ROW, E.Unary("neg", x, ("M", "N"))),),
    )
    with pytest.raises(EmitError, match="2- and 4-byte"):
        emit(bad, default_schedule(bad, DIMS))


# ---------------------------------------------------------------- golden PTX


# Row lengths no suite layout divides, so that the tail paths the defaults fit to them show in
# review too: whole vectors (5000), strided elements (4999), elementwise rows as one run of
# tiles (SiLU-mul at 4999), a streamed row walked from the aligned address before it
# (cross-entropy over 50257).
TAIL_GOLDENS = {
    "rmsnorm": ({"M": 16384, "N": 5000}, {"M": 16384, "N": 4999}),
    "silu_mul": ({"M": 16384, "N": 4999},),
    "cross_entropy": ({"M": 4096, "V": 50257},),
}


def _catalogue_irs():
    from factory.families.row.ir import Unsupported, lower
    from factory.spec import load_catalogue

    out = {}
    for name, w in sorted(load_catalogue().items()):
        # the row IR's operators: the row family's and its refinements' (flat, rowsplit); the
        # attention, matmul and other families have IRs and tests of their own
        if family_registry.name_for(w, default="none") not in ("row", "flat", "rowsplit"):
            continue
        try:
            out[name] = (lower(w), dict(w.shapes[0]))
        except Unsupported:
            continue
        for dims in TAIL_GOLDENS.get(name, ()):
            rows, cols = dims.values()
            out[f"{name}_{rows}x{cols}"] = (out[name][0], dict(dims))
    return out


def _golden_cases():
    cases = {f"hand_{k}": (f(), DIMS) for k, f in EXAMPLES.items()}
    try:
        cases |= _catalogue_irs()
    except Exception:  # noqa: BLE001 - the catalogue tests below say what is wrong
        pass
    return cases


@pytest.mark.parametrize("name", sorted(_golden_cases()))
def test_emitted_ptx_matches_the_golden_file(name):
    ir, dims = _golden_cases()[name]
    ptx = emit(ir, default_schedule(ir, dims)).ptx
    path = GOLDEN / f"{name}.ptx"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(ptx)
    assert path.exists(), f"no golden file {path.name}: run with UPDATE_GOLDEN=1"
    assert ptx == path.read_text(), f"{path.name} changed: review the diff, then UPDATE_GOLDEN=1"


def test_every_catalogue_operator_lowers_and_compiles_at_its_shapes_without_local_memory():
    from factory.families.row.ir import lower
    from factory.spec import load_catalogue

    cat = {
        name: w
        for name, w in load_catalogue().items()
        if family_registry.name_for(w, default="none") in ("row", "flat", "rowsplit")
    }
    assert len(cat) >= 16
    for name, w in sorted(cat.items()):
        ir = lower(w)
        for dims in list(w.shapes) + list(w.heldout_shapes):
            s = default_schedule(ir, dict(dims))
            rep = compile_ptx(emit(ir, s).ptx)
            assert rep.ok, (name, dims, rep.log[:300])
            assert rejection_reason(rep, s.threads_per_block) == "", (name, dims, rep.to_dict())


def test_prefetching_loads_the_next_row_before_working_on_this_one():
    ir = EXAMPLES["rmsnorm"]() if "rmsnorm" in EXAMPLES else EXAMPLES["layernorm"]()
    s = replace(
        default_schedule(ir, DIMS),
        prefetch_rows=True,
        persistent_blocks_per_sm=4,
        min_threads_per_sm=512,
    )
    ptx = emit(ir, s).ptx
    first = ptx.index("prefetch the next row")
    assert ptx.index("pass 0") > first
    assert "the prefetched row becomes this thread's row" in ptx
    assert ".minnctapersm 4" in ptx
    assert compile_ptx(ptx).ok


def test_a_cross_entropy_with_few_rows_gets_more_threads_per_row_and_still_compiles():
    # 4096 rows or more: a warp per row; fewer: at least 128 threads a row (measured on the H200
    # at 2048 and 1024 rows), never a streaming step longer than the row.
    ir = EXAMPLES["cross_entropy"]()
    cases = {(4096, 32000): 32, (2048, 32000): 128, (1024, 32000): 128, (256, 32000): 512}
    for (m, n), threads in cases.items():
        s = default_schedule(ir, {"M": m, "N": n})
        assert (s.mode, s.online, s.threads_per_row) == ("stream", True, threads), (m, s)
        assert s.threads_per_row * s.vec_elems * s.chunks <= n
        rep = compile_ptx(emit(ir, s).ptx)
        assert rep.ok and rep.spill_store_bytes == 0, (m, rep.to_dict())
    assert default_schedule(ir, {"M": 1, "N": 3000}).threads_per_row == 64


@pytest.mark.parametrize("name", ["softmax", "layernorm", "add_rmsnorm", "cross_entropy"])
def test_cluster_rows_compile_without_spills_for_sm_90_and_sm_100(name):
    ir = EXAMPLES[name]()
    s = replace(
        default_schedule(ir, {"M": 16384, "N": 4096}),
        threads_per_row=4096,
        rows_per_block=1,
        chunks=2,  # 1024-thread blocks leave 64 registers a thread
        mode="cached",
        cluster_blocks=4,
        min_threads_per_sm=0,
    )
    for arch in ("sm_90", "sm_100"):
        em = emit(ir, s, arch=arch)
        assert em.launch.cluster == (4, 1, 1) and em.launch.block == (1024, 1, 1)
        assert em.launch.grid[0].endswith("*4")
        rep = compile_ptx(em.ptx, arch=arch)
        assert rep.ok, rep.log
        assert rejection_reason(rep, s.threads_per_block) == "", (name, arch, rep.to_dict())


def test_the_emitter_refuses_cluster_rows_it_cannot_render():
    ir = EXAMPLES["softmax"]()
    base = replace(default_schedule(ir, DIMS), rows_per_block=1, chunks=2, mode="cached")
    for bad, arch in (
        (replace(base, threads_per_row=64, cluster_blocks=2), "sm_90"),  # a warp per block
        (replace(base, threads_per_row=2048, cluster_blocks=2, rows_per_block=2), "sm_90"),
        (replace(base, threads_per_row=2048, cluster_blocks=2), "sm_80"),
    ):
        with pytest.raises(EmitError):
            emit(ir, bad, arch=arch)
