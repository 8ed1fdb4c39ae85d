"""The whole flow on real pages in Chromium: a customer uploads a workload, the factory writes
and compiles a generation, the GPU results come back (imported from a results file recorded on
an H200), an engineer approves, and the customer downloads a zip whose checksums verify.

Screenshots of the job page and the review page go to test-artifacts/."""

import hashlib
import io
import json
import zipfile

import pytest

from tests.browser import recorded
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# A results file recorded on an H200 for softmax batches when one is there; otherwise one written
# by hand in the contract's format (its "note" says so).
RECORDINGS = ("softmax_h200.json", "softmax_contract_example.json")
RECORDING = next((n for n in RECORDINGS if (recorded.FIXTURES / n).exists()), RECORDINGS[-1])


def _factory_ready() -> bool:
    try:
        from factory.loop import propose  # noqa: F401
        from factory.spec import catalogue_manifest, load_manifest  # noqa: F401
    except ImportError:
        return False
    return (recorded.FIXTURES / RECORDING).exists()


@pytest.fixture
def eager_pipeline(settings, tmp_path):
    """Run the Celery tasks in the request that queues them (no workers in a test) and keep
    batches for import instead of sending them to a GPU queue."""
    from portal.celery import app

    settings.MEDIA_ROOT = tmp_path / "media"
    settings.GPU_DISPATCH = False
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


@pytest.mark.skipif(
    not _factory_ready(), reason="needs factory.spec, factory.loop and the recording"
)
def test_the_whole_flow_from_upload_to_a_verified_download(
    live_server, new_page, artifacts_dir, orgs, customer, engineer, eager_pipeline, tmp_path
):
    from portal.models import Candidate, GpuBatch, Job

    base = live_server.url
    page = new_page()
    log_in(page, base, "alice", "alice-pass")

    # Upload: start from the sample manifest, one generation of budget.
    page.click("text=New workload")
    page.click("text=Start from the softmax sample")
    assert "softmax" in page.input_value("#id_manifest")
    page.fill("#id_generations", "1")
    # One job for the sample's three shapes (the H200 recording below is of that batch): the
    # box that makes a job per row length is ticked by default.
    assert page.is_checked("#id_per_row_length")
    page.uncheck("#id_per_row_length")
    # With the eager pipeline the POST plans, writes and compiles a whole generation before
    # it answers (about 11 s on 2 cores, alone): more than the default 15 s under CI's load.
    page.click("text=Validate and start", timeout=90_000)
    page.wait_for_url(f"{base}/jobs/**")
    job = Job.objects.get()
    assert job.status == Job.WAITING_GPU, (job.status, job.stop_reason)
    assert page.locator("#progress").get_attribute("hx-trigger") == "every 1s"

    # The candidate table follows the job without a reload: a candidate's status changed in
    # the database shows in the table, and the page stays the same page (its script state).
    page.evaluate("window.stillHere = true")
    first = Candidate.objects.filter(job=job, status=Candidate.QUEUED).order_by("created")[0]
    Candidate.objects.filter(pk=first.pk).update(status=Candidate.COMPILED)
    row = page.locator("#candidates tr", has=page.locator(f"text={str(first.code)[:8]}"))
    row.locator("text=Compiled").wait_for(timeout=15_000)
    assert page.evaluate("window.stillHere") is True
    Candidate.objects.filter(pk=first.pk).update(status=Candidate.QUEUED)

    # The GPU host is air-gapped: an engineer downloads the batch from the job page and
    # imports the results file that the H200 wrote for it (a recording, put onto this batch).
    reviewer = new_page()
    log_in(reviewer, base, "erin", "erin-pass")
    reviewer.goto(f"{base}/jobs/{job.code}/")
    with reviewer.expect_download() as batch_download:
        reviewer.click("text=Download batch")
    batch_doc = json.loads(open(batch_download.value.path()).read())
    assert batch_doc["batch_id"] == str(GpuBatch.objects.get(job=job).code)
    results = recorded.rebase(recorded.load(RECORDING), batch_doc)
    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(results))
    reviewer.set_input_files("#id_results", str(results_path))
    reviewer.click("#import")
    reviewer.wait_for_selector("text=recorded")

    # The customer's page, still polling, notices the job is done and reloads with the charts.
    page.wait_for_selector("#progress[data-status=review]", timeout=20_000)
    page.wait_for_selector(".plotly-graph-div .main-svg")
    page.screenshot(path=str(artifacts_dir / "workload_page.png"), full_page=True)

    # The engineer reviews and approves.
    reviewer.click("text=Review queue")
    reviewer.click(f"a[href='/review/{job.code}/']")
    reviewer.wait_for_selector("#checklist")
    reviewer.screenshot(path=str(artifacts_dir / "review_page.png"), full_page=True)
    failing = reviewer.locator("#checklist li.fail").all_inner_texts()
    reviewer.fill("#id_comment", "Checked the evidence of the H200 run.")
    if failing:
        reviewer.check("#id_override")
    reviewer.click("#approve")
    reviewer.wait_for_url(f"{base}/review/")
    job.refresh_from_db()
    assert job.status == Job.APPROVED
    # A check that failed on the recorded evidence is approved only as a recorded override.
    decision = job.reviews.get()
    assert decision.checklist["override"] == bool(failing), failing

    # The customer is told on the job page and downloads the artifact.
    page.goto(f"{base}/jobs/{job.code}/")
    assert "Approved" in page.locator("#decision").inner_text()
    with page.expect_download() as download_info:
        page.click("#download")
    data = open(download_info.value.path(), "rb").read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for line in z.read("SHA256SUMS").decode().splitlines():
            digest, name = line.split("  ", 1)
            assert hashlib.sha256(z.read(name)).hexdigest() == digest, name
        manifest = json.loads(z.read("manifest.json"))
    assert manifest["entry"] == job.best_candidate.entry
    assert manifest["launch_per_shape"] and manifest["versions"]["driver"]
