"""The evidence page: engineers see what every job has taught, by family, GPU, dtype and shape."""

import pytest
from django.urls import reverse

from factory.families.row.schedules import Schedule
from portal.derived import schedule_label
from portal.models import Candidate, Workload
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_jobs(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    jobs = [
        job_in_review(orgs[0], customer, candidates=4, failing=(3,)),
        job_in_review(orgs[1], customer, candidates=3, base_us=20.0),
    ]
    Workload.objects.update(family="softmax")
    for i, c in enumerate(Candidate.objects.order_by("pk")):
        s = Schedule(threads_per_row=(128, 256, 512, 1024)[i % 4], chunks=(4, 2, 1, 1)[i % 4])
        Candidate.objects.filter(pk=c.pk).update(
            schedule=s.to_dict(), schedule_label=schedule_label(s.to_dict())
        )
    return jobs


def test_engineers_see_every_family_with_its_outcomes(client, engineer, two_jobs):
    client.force_login(engineer)
    page = client.get(reverse("web-evidence"))
    assert page.status_code == 200
    (row,) = page.context["families"]
    assert (row["family"], row["jobs"], row["candidates"]) == ("softmax", 2, 7)
    assert (row["passed"], row["failed"]) == (6, 1)
    assert row["best_tbps"] > 0
    assert reverse("web-evidence") in page.content.decode()  # in the engineers' menu


def test_a_family_opens_with_lessons_choices_the_fastest_and_the_failures(
    client, engineer, two_jobs
):
    client.force_login(engineer)
    page = client.get(reverse("web-evidence"), {"family": "softmax", "gpu": "sm_90"})
    assert page.status_code == 200
    view = page.context["view"]
    assert view["jobs"] == 2 and view["records"] > 0
    assert view["top"] and view["top"][0]["what"].startswith("ct128")  # base_us 10: the fastest
    assert any(c["field"] == "threads_per_row" for c in view["choices"])
    # (each layout here differs from the others in two fields: no one-field pair to show)
    assert all(c["pairs"] == 0 for c in view["choices"])
    assert view["failures"] and view["failures"][0][1] == 1
    html = page.content.decode()
    assert "Lessons the planner and the prompts read" in html and "threads_per_row" in html
    assert "Level in one-field pairs" in html
    assert "Generator kernels by tag:" in html and "t threads per row" in html  # the legend
    # a filter that matches nothing leaves an empty view, not an error
    page = client.get(
        reverse("web-evidence"), {"family": "softmax", "gpu": "sm_90", "dtype": "fp8"}
    )
    assert page.status_code == 200 and page.context["view"]["records"] == 0


def test_an_unknown_family_is_a_404_with_the_overview_still_shown(client, engineer, two_jobs):
    client.force_login(engineer)
    page = client.get(reverse("web-evidence"), {"family": "nope"})
    assert page.status_code == 404 and page.context["families"]


def test_customers_get_a_404(client, customer, two_jobs):
    client.force_login(customer)
    assert client.get(reverse("web-evidence")).status_code == 404
