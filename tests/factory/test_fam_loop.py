"""The issue-50 families through the factory's own loop, offline: a cold generation proposed by
the agents (factory.loop.propose) for each example manifest holds the family's layouts, and
every draft compiles (nvJitLink) and passes the reviewer (occupancy, spills, scalar accesses)."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from factory.spec import load_manifest

ROOT = Path(__file__).parents[2]
FAMS = (
    "colreduce",
    "segreduce",
    "allreduce",
    "scan",
    "argreduce",
    "pool",
    "segnorm",
    "rowsplit",
    "flat",
)
EXAMPLES = sorted(p for f in FAMS for p in glob.glob(str(ROOT / f"factory/examples/{f}_*.toml")))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_a_cold_generation_compiles_and_passes_review(path):
    from factory.agents import review
    from factory.compile import compile_ptx
    from factory.loop import propose

    w = load_manifest(Path(path).read_text())
    fam = Path(path).stem.split("_")[0]
    drafts = propose(w, generation=0, population=6, evidence=[])
    assert len(drafts) == 6
    assert {d.schedule.get("family") for d in drafts} == {fam}
    for d in drafts:
        report = compile_ptx(d.ptx)
        assert report.ok, report.log[:1000]
        assert review(d, report) == (True, ""), d.schedule
