"""One schema for results files and GPU returns: a bad or mismatched value is refused with the
field named, by every way in (service, import command, Celery task), and no evidence changes."""

import copy
import json
import math

import pytest
from django.core.management import CommandError, call_command

from portal import results_schema, services, tasks
from portal.models import (
    BaselineMeasurement,
    Candidate,
    Environment,
    Flag,
    GpuBatch,
    TimingResult,
    VerificationResult,
)
from tests.portal import test_results_record
from tests.portal.results_files import results_for

dispatched = test_results_record.dispatched  # the fixture: two queued candidates out to a GPU


def evidence():
    return [
        m.objects.count()
        for m in (VerificationResult, TimingResult, Flag, BaselineMeasurement, Environment)
    ] + sorted(Candidate.objects.values_list("status", "score_us"))


def _set(results, path, value):
    """results with the field at `path` (a list of keys and indexes) set to `value`."""
    out = copy.deepcopy(results)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()

# (path, bad value, the field the refusal must name)
BAD = [
    (["candidates", 0, "timing", 0, "median_us"], -1, "candidates[0].timing[0].median_us"),
    (["candidates", 0, "timing", 0, "median_us"], 0, "candidates[0].timing[0].median_us"),
    (["candidates", 0, "timing", 0, "median_us"], math.nan, "candidates[0].timing[0].median_us"),
    (["candidates", 0, "timing", 0, "median_us"], math.inf, "candidates[0].timing[0].median_us"),
    (["candidates", 0, "timing", 0, "median_us"], "10.0", "candidates[0].timing[0].median_us"),
    (["candidates", 0, "timing", 0, "median_us"], True, "candidates[0].timing[0].median_us"),
    (["candidates", 0, "timing", 0, "median_us"], _DELETE, "candidates[0].timing[0].median_us"),
    (["candidates", 0, "timing", 0, "median_us"], 10**400, "candidates[0].timing[0].median_us"),
    (
        ["candidates", 0, "timing", 0, "samples_us", 2],
        -3.0,
        "candidates[0].timing[0].samples_us[2]",
    ),
    (["candidates", 0, "timing", 0, "p20_us"], "fast", "candidates[0].timing[0].p20_us"),
    (["candidates", 0, "timing", 0, "dims"], [], "candidates[0].timing[0].dims"),
    (["candidates", 0, "timing"], None, "candidates[0].timing"),
    (["candidates", 0, "timing"], [], "candidates[0].timing"),
    (["candidates", 0, "verification", 0, "passed"], "yes", "candidates[0].verification[0].passed"),
    (["candidates", 0, "verification", 0, "rel_err"], -1, "candidates[0].verification[0].rel_err"),
    (["candidates", 0, "status"], "great", "candidates[0].status"),
    (["candidates", 0, "status"], None, "candidates[0].status"),
    (["candidates", 0, "flags"], "fast", "candidates[0].flags"),
    (["candidates", 0, "reason"], 7, "candidates[0].reason"),
    (["candidates", 0, "ptx_sha256"], "0" * 64, "candidates[0].ptx_sha256"),
    (["candidates", 0, "ptx_sha256"], _DELETE, "candidates[0].ptx_sha256"),
    (["candidates", 0, "id"], "not-ours", "candidates[0].id"),
    (["candidates", 0, "id"], None, "candidates[0].id"),
    (["candidates", 0], None, "candidates[0]"),
    (["candidates"], None, "candidates"),
    (["candidates"], {}, "candidates"),
    (["baselines", 0, "timing", 0, "median_us"], -1, "baselines[0].timing[0].median_us"),
    (["baselines"], None, "baselines"),
    (["env"], "H200", "env"),
    # found by the fuzz suite (FUZZ_PROFILE=long): no JSON column takes NaN or an infinity
    (["candidates", 0, "compile", "ok"], [math.inf], "candidates[0].compile.ok[0]"),
    (["baselines", 0, "config", "mode"], math.nan, "baselines[0].config.mode"),
    (["env", "restart_s"], [math.inf], "env.restart_s[0]"),
    # ... and the columns' own bounds
    (["candidates", 0, "timing", 0, "sm_clock_mhz"], 2**40, "candidates[0].timing[0].sm_clock_mhz"),
    (["candidates", 0, "timing", 0, "bytes"], 10**19, "candidates[0].timing[0].bytes"),
    (["candidates", 0, "timing", 0, "dims"], {"N" * 300: 1}, "candidates[0].timing[0].dims"),
    (["candidates", 0, "flags"], ["k" * 100 + ": too long"], "candidates[0].flags[0]"),
    (["env", "gpu"], "G" * 101, "env.gpu"),
    (["candidates", 0, "reason"], "bad \udcff text", "candidates[0].reason"),
    (["copy_ceiling_tbps"], "4.28", "copy_ceiling_tbps"),
    # found by the fuzz suite on PostgreSQL: its text and jsonb refuse the NUL character
    (
        ["candidates", 0, "verification", 0, "dims"],
        {"\x00": 0},
        "candidates[0].verification[0].dims.\\x00 (the key)",
    ),
    (["env", "cuda_bindings"], "13\x00", "env.cuda_bindings"),
]


def test_a_candidate_with_no_verification_list_is_recorded_as_if_it_had_none(dispatched):
    # found by the fuzz suite: the schema takes a null list where it takes none
    results = _set(results_for(dispatched.batch), ["candidates", 0, "verification"], None)
    results = _set(results, ["candidates", 0, "status"], "failed")
    results = _set(results, ["candidates", 0, "timing"], None)
    services.results_record(results=results)
    dispatched.refresh_from_db()
    assert dispatched.status != GpuBatch.DISPATCHED


@pytest.mark.parametrize(
    ("path", "value", "field"), BAD, ids=[b[2] + "=" + repr(b[1])[:12] for b in BAD]
)
def test_a_results_file_with_a_bad_value_is_refused_naming_the_field_and_evidence_is_unchanged(
    dispatched, path, value, field
):
    results = _set(results_for(dispatched.batch), path, value)
    before = evidence()
    with pytest.raises(services.ResultsError) as refused:
        services.results_record(results=results)
    assert str(refused.value).startswith(field + ":"), str(refused.value)
    assert evidence() == before
    dispatched.refresh_from_db()
    assert dispatched.status == GpuBatch.DISPATCHED


def test_a_recording_of_other_kernels_is_refused(dispatched):
    results = results_for(dispatched.batch)
    first, second = results["candidates"]
    first["ptx_sha256"], second["ptx_sha256"] = second["ptx_sha256"], first["ptx_sha256"]
    before = evidence()
    with pytest.raises(services.ResultsError, match=r"candidates\[0\]\.ptx_sha256: does not match"):
        services.results_record(results=results)
    assert evidence() == before


def test_a_results_file_that_leaves_out_a_candidate_or_repeats_one_is_refused(dispatched):
    results = results_for(dispatched.batch)
    short = _set(results, ["candidates"], results["candidates"][:1])
    with pytest.raises(services.ResultsError, match="^candidates: no record for candidate"):
        services.results_record(results=short)
    twice = _set(results, ["candidates"], [results["candidates"][0]] * 2)
    with pytest.raises(services.ResultsError, match=r"candidates\[1\]\.id: .* reported twice"):
        services.results_record(results=twice)


def test_a_results_file_missing_a_baseline_the_batch_asked_for_is_refused(dispatched):
    doc = dict(dispatched.batch, baselines=["torch_compile", "triton"])
    GpuBatch.objects.filter(pk=dispatched.pk).update(batch=doc)
    results = results_for(dict(doc, baselines=["torch_compile"]))
    with pytest.raises(services.ResultsError, match="^baselines: no record for baseline 'triton'"):
        services.results_record(results=results)
    other = results_for(dict(doc, baselines=["torch_compile", "cublas"]))
    with pytest.raises(services.ResultsError, match=r"^baselines\[1\]\.name: 'cublas' was not"):
        services.results_record(results=other)
    services.results_record(results=results_for(doc))  # complete: recorded
    assert BaselineMeasurement.objects.count() == 2


def test_a_passed_candidate_must_be_timed_at_every_shape(dispatched):
    results = results_for(dispatched.batch)
    del results["candidates"][0]["timing"][1]
    with pytest.raises(services.ResultsError, match=r"^candidates\[0\]\.timing: passed but"):
        services.results_record(results=results)


def test_a_good_file_is_still_recorded(dispatched):
    services.results_record(results=results_for(dispatched.batch))
    dispatched.refresh_from_db()
    assert dispatched.status == GpuBatch.RECORDED


def test_the_import_command_refuses_a_bad_file_naming_the_field(dispatched, tmp_path):
    results = _set(results_for(dispatched.batch), ["candidates", 1, "timing", 0, "median_us"], -1)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    before = evidence()
    with pytest.raises(CommandError, match=r"candidates\[1\]\.timing\[0\]\.median_us: must be"):
        call_command("import_results", str(path))
    assert evidence() == before


@pytest.mark.parametrize(
    "text",
    ["[" * 5000 + "]" * 5000, '{"format": 1, "batch_id": ' + "9" * 5000 + "}", "\udcff", "{"],
    ids=["deep", "5000-digit integer", "lone surrogate", "truncated"],
)
def test_the_import_command_refuses_hostile_json_plainly(db, tmp_path, text):
    path = tmp_path / "results.json"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    with pytest.raises(CommandError, match="cannot read"):
        call_command("import_results", str(path))


def test_the_gpu_return_task_refuses_a_bad_file_and_records_nothing(dispatched, caplog):
    results = _set(results_for(dispatched.batch), ["candidates", 0, "timing", 0, "median_us"], 0)
    before = evidence()
    tasks.results_record.apply(args=(results,))
    assert evidence() == before
    assert "candidates[0].timing[0].median_us" in caplog.text


def test_loads_bounds_depth_integers_and_constants():
    with pytest.raises(results_schema.SchemaError, match="nested"):
        results_schema.loads("[" * 100 + "]" * 100)
    with pytest.raises(results_schema.SchemaError, match="digits"):
        results_schema.loads("1" * 5000)
    with pytest.raises(results_schema.SchemaError, match="not a JSON number"):
        results_schema.loads("[NaN]", allow_nan=False)
    with pytest.raises(results_schema.SchemaError, match="UTF-8"):
        results_schema.loads(b"\xff")
    assert results_schema.loads('{"a": [1, 2.5, NaN]}')["a"][:2] == [1, 2.5]


def test_the_cost_model_ignores_a_time_that_is_not_finite_and_positive():
    from factory.costmodel import CostModel
    from tests.factory.test_costmodel import records

    rows = records()
    for bad in (-1.0, 0.0, math.nan, math.inf, "x"):
        poisoned = rows + [dict(rows[0], median_us=bad)]
        model = CostModel().fit(poisoned)
        assert model.fitted and model.n_train == len(rows)
