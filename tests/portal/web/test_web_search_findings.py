"""Issue 53: the evidence page says per family what the search learnt, which schedule choices
win at which shapes, computed from the stored evidence."""

import pytest
from django.urls import reverse

from factory.families.row.schedules import Schedule
from portal.derived import schedule_label
from portal.models import Candidate, Workload
from portal.selectors.evidence import search_findings
from tests.portal.web.world import job_in_review


def _rec(dims, t, status="passed", sig="s1", **sched):
    return {
        "signature": sig,
        "workload_sha256": "w1",
        "dims": dims,
        "median_us": t,
        "status": status,
        "schedule": {"family": "matmul", **sched},
    }


SQUARE = {"M": 4096, "N": 4096, "K": 4096}
SKINNY = {"M": 128, "N": 4096, "K": 4096}


def test_a_value_wins_the_shapes_where_it_is_fastest_by_a_margin():
    records = [
        _rec(SQUARE, 100.0, tile_n=256, stages=4),
        _rec(SQUARE, 125.0, tile_n=128, stages=4),
        _rec(SQUARE, 101.0, tile_n=256, stages=3),  # stages: within 2% at the square shape
        _rec(SKINNY, 10.0, tile_n=128, stages=4),
        _rec(SKINNY, 12.0, tile_n=256, stages=4),
        _rec(SKINNY, 14.0, tile_n=256, stages=3),
        _rec(SKINNY, 1.0, tile_n=64, stages=4, status="failed"),  # not verified: no lesson
    ]
    out = {f["field"]: f for f in search_findings(records, {"w1": "gemm"})}
    tile = out["tile_n"]
    assert tile["decided"] == 2 and not tile["even"]
    by_value = {w["value"]: w for w in tile["wins"]}
    assert by_value["256"]["shapes"] == ["gemm M=4096 N=4096 K=4096"]
    assert by_value["256"]["margin"] == pytest.approx(1.25)
    assert by_value["128"]["shapes"] == ["gemm M=128 N=4096 K=4096"]
    assert by_value["128"]["margin"] == pytest.approx(1.2)
    assert "tile_n = 256 is fastest at 1 of 2 shapes (gemm M=4096 N=4096 K=4096)" in tile["text"]
    assert "1.25x slower" in tile["text"]
    # stages decided the skinny shape (4 stages at 10 us, 3 at 14 us) and not the square one
    stages = out["stages"]
    assert [w["value"] for w in stages["wins"]] == ["4"]
    assert stages["even"] == ["gemm M=4096 N=4096 K=4096"]
    assert "less than 2% difference" in stages["text"]
    assert "family" not in out and "problem" not in out


def test_shapes_of_different_operators_are_not_compared():
    records = [
        _rec(SQUARE, 100.0, sig="a", tile_n=256),
        _rec(SQUARE, 50.0, sig="b", tile_n=128),  # another operator, faster: no comparison
    ]
    assert search_findings(records) == []


def test_a_field_with_one_value_per_shape_teaches_nothing():
    records = [_rec(SQUARE, 100.0, tile_n=256), _rec(SKINNY, 10.0, tile_n=128)]
    assert search_findings(records) == []


@pytest.mark.django_db
def test_the_evidence_page_says_which_choice_won_where(
    client, engineer, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job_in_review(orgs[0], customer, candidates=3)  # measured 10, 11, 12 us
    Workload.objects.update(family="softmax")
    for c, tpr in zip(Candidate.objects.order_by("pk"), (512, 256, 128), strict=True):
        s = Schedule(threads_per_row=tpr).to_dict()
        Candidate.objects.filter(pk=c.pk).update(schedule=s, schedule_label=schedule_label(s))
    client.force_login(engineer)
    page = client.get(reverse("web-evidence"), {"family": "softmax", "gpu": "sm_90"})
    findings = page.context["view"]["findings"]
    assert [f["field"] for f in findings] == ["threads_per_row"]
    assert findings[0]["wins"][0]["value"] == "512"
    html = page.content.decode()
    assert "What the search learnt" in html
    assert "threads_per_row = 512 is fastest at" in html and "1.10x slower" in html
