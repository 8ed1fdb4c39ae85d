"""Engineers carry a batch to an air-gapped GPU host and its results back through the job page."""

import json
import uuid

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from portal.models import Candidate, Generation, GpuBatch, Job
from tests.portal.results_files import results_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(acme_world):
    """The Acme job with one candidate in a batch out to the GPU."""
    job = acme_world["job"]
    generation = acme_world["candidate"].generation
    Candidate.objects.filter(job=job).update(status=Candidate.QUEUED)
    Generation.objects.filter(pk=generation.pk).update(status=Generation.GPU)
    Job.objects.filter(pk=job.pk).update(status=Job.WAITING_GPU, max_generations=1)
    code = uuid.uuid4()
    GpuBatch.objects.create(
        code=code,
        job=job,
        generation=generation,
        status=GpuBatch.DISPATCHED,
        batch={
            "format": 1,
            "batch_id": str(code),
            "shapes": [{"N": 1024}],
            "heldout_shapes": [{"N": 1023}],
            "candidates": [{"id": str(acme_world["candidate"].code)}],
        },
    )
    job.refresh_from_db()
    return job


def _file(doc, name="results.json"):
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return SimpleUploadedFile(name, data, content_type="application/json")


def test_an_engineer_downloads_the_waiting_batch(client, engineer, waiting):
    client.force_login(engineer)
    response = client.get(reverse("web-job-batch", args=[waiting.code]))
    assert response.status_code == 200
    assert json.loads(response.content)["batch_id"] == str(waiting.batches.get().code)
    assert "attachment" in response["Content-Disposition"]


def test_an_engineer_imports_the_results_and_the_job_moves_on(client, engineer, waiting):
    client.force_login(engineer)
    results = results_for(waiting.batches.get().batch)
    response = client.post(
        reverse("web-job-import", args=[waiting.code]), {"results": _file(results)}
    )
    assert response.status_code == 302
    batch = waiting.batches.get()
    assert batch.status == GpuBatch.RECORDED and batch.source == "import"
    assert Candidate.objects.get(job=waiting).status == Candidate.PASSED


@pytest.mark.parametrize(
    "payload, words",
    [
        (b"\x89PNG\r\n", "not JSON"),
        (b"{broken", "not JSON"),
        ({"format": 1, "batch_id": str(uuid.uuid4()), "candidates": []}, "another job"),
        ([1, 2, 3], "another job"),
    ],
)
def test_a_bad_results_file_is_refused_with_a_400(client, engineer, waiting, payload, words):
    client.force_login(engineer)
    response = client.post(
        reverse("web-job-import", args=[waiting.code]), {"results": _file(payload)}
    )
    assert response.status_code == 400
    assert words in response.context["import_error"]
    assert waiting.batches.get().status == GpuBatch.DISPATCHED


def test_results_of_another_jobs_batch_are_refused(client, engineer, waiting, globex_world):
    other = globex_world["job"]
    code = uuid.uuid4()
    GpuBatch.objects.create(
        code=code,
        job=other,
        generation=other.generations.get(),
        status=GpuBatch.DISPATCHED,
        batch={},
    )
    client.force_login(engineer)
    doc = {"format": 1, "batch_id": str(code), "candidates": []}
    response = client.post(reverse("web-job-import", args=[waiting.code]), {"results": _file(doc)})
    assert response.status_code == 400


def test_customers_can_neither_export_nor_import(client, customer, waiting):
    client.force_login(customer)
    assert client.get(reverse("web-job-batch", args=[waiting.code])).status_code == 404
    results = results_for(waiting.batches.get().batch)
    response = client.post(
        reverse("web-job-import", args=[waiting.code]), {"results": _file(results)}
    )
    assert response.status_code == 404
    assert waiting.batches.get().status == GpuBatch.DISPATCHED
