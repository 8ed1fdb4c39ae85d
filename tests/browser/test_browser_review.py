"""In a real browser: an engineer reviews recorded evidence and approves, the customer is told
on the job page and downloads a zip whose checksums verify."""

import hashlib
import io
import zipfile

import pytest

from factory.families.row.schedules import Schedule
from portal.models import Candidate, Workload
from tests.browser.conftest import log_in
from tests.portal.web.world import job_in_review

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_engineer_approves_in_the_browser_and_the_customer_downloads(
    live_server, new_page, artifacts_dir, orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    base = live_server.url

    reviewer = new_page()
    log_in(reviewer, base, "erin", "erin-pass")
    reviewer.click("text=Review queue")
    reviewer.click(f"a[href='/review/{job.code}/']")
    reviewer.wait_for_selector("#checklist")
    assert reviewer.locator("#checklist li.pass").count() == 4
    reviewer.screenshot(path=str(artifacts_dir / "review_page_recorded.png"), full_page=True)
    reviewer.click(f"a[href='/candidates/{job.best_candidate.code}/']")
    reviewer.wait_for_selector("#ptx")
    reviewer.screenshot(path=str(artifacts_dir / "candidate_page.png"), full_page=True)
    reviewer.go_back()
    # what the factory has learnt, for the engineer: the family's evidence page
    Workload.objects.filter(pk=job.workload_id).update(family="softmax")
    for i, c in enumerate(Candidate.objects.filter(job=job).order_by("pk")):
        s = Schedule(threads_per_row=(128, 256, 512)[i % 3], chunks=(4, 2, 1)[i % 3])
        Candidate.objects.filter(pk=c.pk).update(schedule=s.to_dict())
    reviewer.click("text=Evidence")
    reviewer.click("a:has-text('Open')")
    reviewer.wait_for_selector("text=Lessons the planner and the prompts read")
    reviewer.screenshot(path=str(artifacts_dir / "evidence_page.png"), full_page=True)
    reviewer.goto(f"{base}/review/{job.code}/")
    reviewer.fill("#id_comment", "Verified at every shape, 2x over torch.compile.")
    reviewer.click("#approve")
    reviewer.wait_for_url(f"{base}/review/")
    assert "approved" in reviewer.locator(".messages").inner_text()

    page = new_page()
    log_in(page, base, "alice", "alice-pass")
    page.goto(f"{base}/jobs/{job.code}/")
    assert "Approved" in page.locator("#decision").inner_text()
    page.wait_for_selector(".plotly-graph-div .main-svg")
    page.screenshot(path=str(artifacts_dir / "job_page_recorded.png"), full_page=True)
    with page.expect_download() as download_info:
        page.click("#download")
    data = open(download_info.value.path(), "rb").read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        sums = z.read("SHA256SUMS").decode().splitlines()
        for line in sums:
            digest, name = line.split("  ", 1)
            assert hashlib.sha256(z.read(name)).hexdigest() == digest, name
        assert {"kernel.ptx", "manifest.json", "cubin/sm_90.cubin"} <= set(z.namelist())
