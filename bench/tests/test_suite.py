"""bench/suite.py on the CPU: its plan-free candidates for every suite operator (valid, screened,
in a batch the GPU worker accepts), plans, and the table and summary it writes from recorded runs
(trimmed copies under bench/tests/fixtures of folders in bench/results)."""

import json
from pathlib import Path

import pytest

from bench import suite
from factory.compile import rejection_reason
from factory.emit import emit
from factory.families.row.schedules import Schedule, default_schedule, is_valid
from gpuworker.batch import parse_batch

CATALOGUE = suite._catalogue()
FIXTURES = Path(__file__).with_name("fixtures")


@pytest.mark.parametrize("name", suite.OPS)
def test_the_suite_candidates_are_valid_and_screened(name):
    w, manifest, ir = CATALOGUE[name]
    dims = dict(w.shapes[0])
    picked = suite.candidate_schedules(ir, dims)
    assert 2 <= len(picked) <= suite.CANDIDATES_PER_SHAPE
    assert picked[0] == default_schedule(ir, dims)
    assert len(set(picked)) == len(picked)
    for s in picked:
        assert is_valid(ir, s, dims)[0], s.tag()
        rep = suite.compile_cached(emit(ir, s).ptx)
        assert rep.ok and rejection_reason(rep, s.threads_per_block) == "", s.tag()
    batch, schedules = suite.build_batch(
        name, manifest, ir, [dims], ["torch_eager"], 0.2, w.heldout_shapes
    )
    parsed = parse_batch(batch)
    assert len(parsed.candidates) == len(picked) == len(schedules)
    assert parsed.heldout_shapes[-1][ir.row_dim] == 40000  # the streaming fallback is judged


def test_a_plan_from_recorded_runs_lists_each_shapes_fastest_verified_schedules(tmp_path):
    # suite run 4 (bench/results/2026-12-02-h200-suite3): the candidates' medians, and the
    # schedules of the two plans it ran
    runs = FIXTURES / "suite3"
    plan = suite.plan_from_results(
        [f"{runs}/run1-plan-d", f"{runs}/run2-plan-e"],
        [f"{runs}/suite-2026-12-02d.json", f"{runs}/suite-2026-12-02e.json"],
        top=2,
    )
    assert set(plan) == set(suite.OPS)
    rms = plan["rmsnorm"]["16384x4096"]
    assert len(rms) == 2
    # run 4's fastest RMSNorm at 16384x4096: 64.7 us with the weight loaded early
    assert Schedule.from_dict(rms[0]).tag() == "ct128r1v8c4e_nlno"
    raw = json.loads((runs / "run2-plan-e" / "raw_rmsnorm.json").read_text())
    (t,) = [
        t
        for c in raw["candidates"]
        if c["id"] == "rmsnorm:ct128r1v8c4e_nlno"
        for t in c["timing"]
        if t["dims"] == {"M": 16384, "N": 4096}
    ]
    assert round(t["median_us"], 1) == 64.7
    out = tmp_path / "plan.json"
    argv = ["--make-plan", str(out), "--plan-from", f"{runs}/run2-plan-e"]
    argv += ["--plans", f"{runs}/suite-*.json"]
    assert suite.main(argv + ["--ops", "rmsnorm", "--top", "1"]) == 0
    written = json.loads(out.read_text())
    assert list(written) == ["rmsnorm"]
    assert all(len(v) == 1 for v in written["rmsnorm"].values())


def test_the_summary_says_which_slower_cases_are_inside_the_spread_and_bounds_the_mean():
    rows = json.loads((FIXTURES / "suite4-plan-h-rows.json").read_text())
    text = "\n".join(suite.summary_lines(rows))
    # add+RMSNorm 16384x4096: 126.0 us (p20 125.4) against torch.compile's 125.4 (p80 126.0)
    assert "add_rmsnorm 16384x4096 0.46% slower than torch_compile (inside the p20-p80" in text
    # RMSNorm 16384x8192: 128.7 us (p20 128.3) against max-autotune's 124.3 (p80 144.4: its
    # samples spread wide), so inside too; with a tight spread the verdict would be plain
    assert "rmsnorm 16384x8192 3.49% slower than torch_compile_max_autotune (inside" in text
    tight = [dict(r, p80_us=r["median_us"]) for r in rows]
    tight_text = "\n".join(suite.summary_lines(tight))
    assert "3.49% slower than torch_compile_max_autotune" in tight_text
    assert "3.49% slower than torch_compile_max_autotune (inside" not in tight_text
    assert "(20 cases): 1.395x (not met, target 1.5x); at most 1.416x" in text


def test_a_plan_that_writes_one_schedule_twice_times_it_once(monkeypatch):
    w, _, ir = CATALOGUE["rmsnorm"]
    dims = {"M": 16384, "N": 4096}
    s = Schedule(threads_per_row=128, chunks=4, load_hint="nc_l2last")
    spelled_out = s.to_dict() | {"col_groups": 1, "early_cols": False}  # the defaults written
    assert Schedule.from_dict(spelled_out) == s and spelled_out != s.to_dict()
    other = Schedule(threads_per_row=256, chunks=2, load_hint="nc_l2last")
    plan = {"rmsnorm": {"16384x4096": [s.to_dict(), other.to_dict(), spelled_out]}}
    monkeypatch.setattr(suite, "_PLAN", plan)
    assert suite.planned_schedules("rmsnorm", ir, dims) == [s, other]


def test_a_report_of_a_run_timed_without_the_stream_hold_says_so(tmp_path):
    import shutil

    run = FIXTURES / "suite6-plan-p2"  # worker-timed, before the hold
    for name in ("raw_rmsnorm.json", "raw_add_rmsnorm.json"):
        shutil.copy(f"{run}/{name}", tmp_path / name)
    suite.report(str(tmp_path))
    summary = (tmp_path / "summary.md").read_text()
    assert "Timed without the stream hold** (add_rmsnorm, rmsnorm)" in summary
    assert "lab.probes.host_gaps" in (tmp_path / "table.md").read_text()
    raws = [json.loads((tmp_path / "raw_rmsnorm.json").read_text())]
    for b in raws[0]["baselines"]:
        for t in b.get("timing") or []:
            t["hold_us"] = 100.0
    assert suite.host_gap_warning(raws) == []  # timed behind the hold
    direct = json.loads((FIXTURES / "explore8-direct-raw_rmsnorm.json").read_text())
    assert direct["mode"] == "direct" and suite.host_gap_warning([direct]) == []


def test_chart_in_the_repository_links_the_vendored_plotly(tmp_path):
    from pathlib import Path

    from bench.plotly_js import VENDOR, plotly_src

    chart = VENDOR.parents[2] / "bench" / "results" / "some-run" / "run1" / "chart.html"
    src = plotly_src(chart)
    assert src == "../../../../static/vendor/plotly.min.js"
    assert (chart.parent / src).resolve() == VENDOR
    # outside the repository (a GPU host's output folder) the chart carries plotly.js itself
    assert plotly_src(Path(tmp_path) / "chart.html") is True


def test_max_autotune_joins_the_baselines_in_direct_runs_as_in_worker_runs():
    # Direct mode used to drop --max-autotune without a word: its run timed torch.compile's
    # default mode only (bench/results/2026-12-03-h200-suite11/direct-plan-t).
    from argparse import Namespace

    args = Namespace(baselines="torch_eager,torch_compile", max_autotune=True)
    assert suite.baseline_names(args) == [
        "torch_eager",
        "torch_compile",
        "torch_compile_max_autotune",
    ]
    args = Namespace(baselines="torch_compile_max_autotune", max_autotune=True)
    assert suite.baseline_names(args) == ["torch_compile_max_autotune"]
    assert suite.baseline_names(Namespace(baselines="triton,", max_autotune=False)) == ["triton"]


def test_the_summary_names_every_entrant_above_the_copy_ceiling():
    # Suite run 14: SiLU-mul (two reads, one write) ran at 103.4-103.9% of the copy ceiling, and
    # three baselines passed the worker's 2% margin there too; nothing else did.
    rows = json.loads((FIXTURES / "suite11-plan-s-rows.json").read_text())
    lines = suite.summary_lines(rows)
    mixed, line = [x for x in lines if x.startswith("- above the copy ceiling")]
    assert mixed.endswith("): none")  # run 14 predates the byte mover: nothing is explained
    assert "ours at silu_mul 16384x4096 103.6%" in line
    assert "torch_compile at silu_mul 16384x8192 102.1%" in line
    flagged = [x for x in lines if x.startswith("| ") and "%* |" in x]
    assert [x.split(" | ")[0:2] for x in flagged] == [
        ["| silu_mul", "16384x4096"],
        ["| silu_mul", "16384x8192"],
        ["| silu_mul", "32768x4096"],
    ]
    # At exactly the margin nothing is flagged: the margin is the worker's own
    calm = [dict(r, fraction_of_ceiling=min(r["fraction_of_ceiling"], 1.02)) for r in rows]
    assert "- above the copy ceiling by more than 2% (" in "\n".join(suite.summary_lines(calm))
    assert suite.summary_lines(calm)[-1].endswith("): none")


def test_a_row_above_the_copy_ceiling_carries_what_the_byte_mover_of_its_bytes_reached():
    raw = json.loads((FIXTURES / "suite12-plan-s-raw_silu_mul.json").read_text())
    assert "byte_mover" not in raw  # run 15 predates the mover: its rows carry none
    assert all(r["byte_mover_tbps"] is None for r in suite.rows_from(raw))
    # as the worker now records it: each benchmarked shape's judge_mix rate
    ceiling = raw["copy_ceiling_tbps"]
    shapes = [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}]
    raw["byte_mover"] = [
        {"dims": shapes[0], "tbps": 1.035 * ceiling},  # a + b of these bytes ran ~103-104%
        {"dims": shapes[1], "tbps": 1.0 * ceiling},  # a mover no faster than a copy
        {"dims": shapes[2], "error": "not timed"},
    ]
    rows = suite.rows_from(raw)
    by = {(r["shape"], r["ours"]): r for r in rows if r["ours"]}
    assert by[("16384x4096", True)]["byte_mover_tbps"] == 1.035 * ceiling
    lines = suite.summary_lines(rows)
    mixed, flagged = [x for x in lines if x.startswith("- above the copy ceiling")]
    # ours at 104.1%: within the mover's 103.5% plus the 2% margin, so the mix explains it and
    # the row is marked + (not flagged), as the worker does not flag it
    assert "within 2% of the worker's byte mover" in mixed
    assert "ours at silu_mul 16384x4096 104.1% (the byte mover of its bytes: 103.5%)" in mixed
    assert "16384x4096" not in flagged
    table = {tuple(x.split(" | ")[0:2]): x for x in lines if x.startswith("| silu_mul")}
    assert "| 104.1%+ |" in table["| silu_mul", "16384x4096"]
    # at 16384x8192 the mover ran at the copy's rate: ours at 104.1% is above it, so flagged
    assert "ours at silu_mul 16384x8192 104.1% (the byte mover of its bytes: 100.0%)" in flagged
    assert "| 104.1%* |" in table["| silu_mul", "16384x8192"]
    # no mover measured at 32768x4096: flagged, with nothing said for it
    assert "ours at silu_mul 32768x4096 105.2%;" in flagged


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("", "gpu"),
        ("No devices were found", "gpu"),
    ],
)
def test_the_results_folder_is_named_for_the_card_that_ran(name, slug):
    assert suite.card_slug(name) == slug
