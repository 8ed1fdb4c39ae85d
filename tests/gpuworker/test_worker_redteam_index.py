"""The red-team fixtures are complete and consistent (no GPU needed)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpuworker_redteam import build_batch, verdicts  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "redteam"


def test_every_fixture_has_its_source_and_ptx_and_there_are_at_least_15_cheats():
    index = json.loads((FIXTURES / "fixtures.json").read_text())
    cheats = [f for f in index["fixtures"] if f["expect_status"] != "passed"]
    assert len(cheats) >= 15
    for f in index["fixtures"]:
        assert (FIXTURES / f"{f['name']}.cu").exists()
        ptx = (FIXTURES / f"{f['name']}.ptx").read_text()
        assert f".entry {f['name']}(" in ptx


def test_the_red_team_batch_is_a_valid_batch_for_its_manifest():
    from factory.spec import load_manifest
    from gpuworker.batch import parse_batch

    batch, index = build_batch()
    b = parse_batch(batch)
    assert len(b.candidates) == len(index["fixtures"])
    w = load_manifest(b.manifest)
    assert w.outputs[0].dtype == "fp32"


def test_a_verdict_counts_only_with_the_expected_status_and_reason():
    _, index = build_batch()
    results = {
        "candidates": [
            {
                "id": "oob_write",
                "status": "failed",
                "reason": "x: out-of-bounds write: 4 bytes",
                "timing": [],
            },
            {
                "id": "input_mutation",
                "status": "failed",
                "reason": "relative error 1 > 1e-05",
                "timing": [],
            },
        ]
    }
    rows = {r["fixture"]: r for r in verdicts(results, index)}
    assert rows["oob_write"]["caught"] is True
    assert rows["input_mutation"]["caught"] is False  # failed, but not for the planted reason
