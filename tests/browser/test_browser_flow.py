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
def queued_tasks(settings, tmp_path, monkeypatch):
    """What the workers would do, done by the test's thread when it asks (`run`): the tasks the
    pipeline queues are kept in a list instead of going to a broker, so the upload answers at
    once as it does with real workers, and the generation is planned, written and compiled
    outside any request (under load that took longer than any page may wait). Batches are kept
    for import instead of going to a GPU queue."""
    from portal import pipeline

    settings.MEDIA_ROOT = tmp_path / "media"
    settings.GPU_DISPATCH = False
    queued: list[tuple[str, int]] = []
    real_task = pipeline._task

    class Kept:
        def __init__(self, name):
            self.name = name

        def delay(self, pk):
            queued.append((self.name, pk))

    monkeypatch.setattr(pipeline, "_task", Kept)

    def run() -> int:
        """Run the queued tasks, and those they queue, until none is left; how many ran."""
        ran = 0
        while queued:
            name, pk = queued.pop(0)
            real_task(name).apply(args=(pk,), throw=True)
            ran += 1
        return ran

    return run


@pytest.mark.skipif(
    not _factory_ready(), reason="needs factory.spec, factory.loop and the recording"
)
def test_the_whole_flow_from_upload_to_a_verified_download(
    live_server, new_page, artifacts_dir, orgs, customer, engineer, queued_tasks, tmp_path
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
    # The upload answers at once; the job page polls while the workers (this thread) plan,
    # write and compile generation 0 (about 11 s on 2 cores alone, minutes under load).
    page.click("text=Validate and start")
    page.wait_for_url(f"{base}/jobs/**")
    assert page.locator("#progress").get_attribute("hx-trigger") == "every 1s"
    assert queued_tasks() >= 3  # job_start, generation_propose, the candidates' builds...
    job = Job.objects.get()
    assert job.status == Job.WAITING_GPU, (job.status, job.stop_reason)
    page.wait_for_selector("#progress[data-status=waiting_gpu]")

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
    queued_tasks()  # the workers finish the generation: the search's budget is spent

    # The customer's page, still polling, notices the job is done and reloads with the charts.
    page.wait_for_selector("#progress[data-status=review]")
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
