"""The agents propose only kernels that can run at the job's held-out shapes too: the GPU worker
verifies every candidate there, and a kernel that cannot serve one (a matmul whose output is
stored by TMA needs rows of a multiple of 16 bytes; the derived held-out N is odd) would be
refused before it ran, costing the job a place in its generation."""

from __future__ import annotations

from pathlib import Path

from factory.agents.context import build_context, default_item, seed_items
from factory.spec import load_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "factory" / "examples" / "matmul_bias_gelu.toml"


def _ctx(text: str):
    w = load_manifest(text)
    return w, build_context(
        w, generation=0, population=4, evidence=[], seed=0, settings={"backend": "offline"}
    )


def _tma(item) -> int:
    return int(getattr(item.value, "tma_store", 0) or 0)


def test_derived_heldout_shapes_keep_tma_store_out_of_the_job():
    w, ctx = _ctx(EXAMPLE.read_text())
    assert any(d["N"] % 8 for d in w.heldout_shapes), "the derived held-out N is odd"
    assert ctx.gen_items, "the space is not empty"
    assert not [it for it in ctx.gen_items if _tma(it)]
    d = default_item(ctx)
    assert d is not None and not _tma(d)
    assert all(not _tma(it) for it in seed_items(ctx))


def test_aligned_heldout_shapes_keep_the_tma_store_default():
    text = EXAMPLE.read_text() + (
        "\n[[heldout_shapes]]\nM = 37\nN = 4104\nK = 4104\n"
        "\n[[heldout_shapes]]\nM = 1\nN = 1032\nK = 1032\n"
    )
    w, ctx = _ctx(text)
    assert all(d["N"] % 8 == 0 for d in w.heldout_shapes)
    assert [it for it in ctx.gen_items if _tma(it)]
    d = default_item(ctx)
    assert d is not None and _tma(d) == 128
