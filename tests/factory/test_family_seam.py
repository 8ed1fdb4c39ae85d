"""The family seam: a family is its folder plus one registration. The copy family in
tests/families/copy is known to nothing else, yet the agents propose for it, the compile stage
compiles its kernels, the GPU worker's batch format carries it and the evidence names its
schedules through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory import families
from factory.compile import compile_ptx
from factory.spec import load_manifest
from tests.families import copy as copy_family

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def copy_registered():
    families.register(copy_family.FAMILY)
    yield copy_family.FAMILY
    families.unregister("copy")


def test_the_registry_finds_the_built_in_row_family_for_a_catalogue_operator():
    from factory.spec import load_catalogue

    fam, ir = families.family_for(load_catalogue()["rmsnorm"])
    assert fam.name == "row" and ir.row_dim == "N"
    assert "row" in families.names()


def test_an_unknown_family_is_a_key_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="known: .*row"):
        families.get("no-such-family")


def test_a_registered_family_is_asked_first_and_lowers_its_workload(copy_registered):
    fam, ir = families.family_for(load_manifest(copy_family.MANIFEST))
    assert fam is copy_registered and ir.dims == ("M", "N")


def test_without_registration_the_copy_manifest_goes_to_a_built_in_family():
    # a copy is pure elementwise work: the flat family (issue 50), asked before the row family
    fam, _ = families.family_for(load_manifest(copy_family.MANIFEST))
    assert fam.name == "flat"


def test_the_agents_propose_for_the_registered_family_and_every_kernel_compiles(copy_registered):
    from factory.agents.review import review
    from factory.loop import propose

    workload = load_manifest(copy_family.MANIFEST)
    drafts = propose(workload, generation=0, population=4, evidence=[], seed=0, settings={})
    assert len(drafts) == 4
    assert {d.schedule["family"] for d in drafts} == {"copy"}
    assert len({d.ptx_sha256 for d in drafts}) == 4
    for d in drafts:
        report = compile_ptx(d.ptx, "sm_90")
        assert report.ok, report.log
        ok, reason = review(d, report)
        assert ok, reason


def test_the_batch_carries_the_family_and_the_worker_accepts_it(copy_registered):
    from factory.loop import build_batch, propose
    from gpuworker.batch import parse_batch

    workload = load_manifest(copy_family.MANIFEST)
    drafts = propose(workload, generation=0, population=2, evidence=[], seed=1, settings={})
    batch = build_batch(
        workload,
        {f"c{i}": d for i, d in enumerate(drafts)},
        baselines=list(copy_registered.baselines),
        options={},
    )
    assert batch["family"] == "copy"
    parsed = parse_batch(batch)
    assert parsed.family == "copy" and len(parsed.candidates) == 2


def test_the_worker_refuses_a_batch_whose_family_is_not_a_name():
    from gpuworker.batch import BatchError, parse_batch

    workload = load_manifest(copy_family.MANIFEST)
    batch = {
        "format": 1,
        "batch_id": "b",
        "family": "../row",
        "manifest": workload.manifest,
        "shapes": [{"M": 4, "N": 4}],
        "candidates": [],
        "baselines": [],
    }
    with pytest.raises(BatchError, match="family"):
        parse_batch(batch)


def test_evidence_and_labels_name_the_familys_schedules_through_it(copy_registered):
    from factory.evidence import schedule_key

    s = {"family": "copy", "block": 256, "vec": 2}
    assert families.label(s) == "copy: 256 threads, 2 a thread"
    assert schedule_key(s) == schedule_key(dict(reversed(list(s.items()))))


def test_the_cost_model_ranks_with_the_familys_roofline(copy_registered):
    from factory.agents.context import build_context

    workload = load_manifest(copy_family.MANIFEST)
    ctx = build_context(workload, generation=0, population=4, evidence=[], seed=0, settings={})
    assert ctx.generator is copy_registered and len(ctx.gen_items) == 12
    bytes_, flops = ctx._roof({"M": 64, "N": 1000})
    assert bytes_ == 2 * 64 * 1000 * 4 and flops == 0.0


def test_nothing_outside_the_copy_familys_folder_names_it():
    hits = []
    for package in ("factory", "gpuworker", "portal", "templates"):
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", ".html") and "tests.families" in path.read_text():
                hits.append(str(path.relative_to(ROOT)))
    assert hits == []
