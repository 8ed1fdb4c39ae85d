"""lab.probes.portal_gpu reads the job page as a customer does: its helpers against the real
fragment."""

import pytest
from django.urls import reverse
from django.utils import timezone

from lab.probes.portal_gpu import Portal, queue_line, text_of
from portal.models import GpuBatch, Job
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


def test_the_queue_line_is_read_from_the_rendered_progress_fragment(client, customer, orgs):
    job = job_in_review(orgs[0], customer)
    GpuBatch.objects.filter(job=job).update(status=GpuBatch.DISPATCHED, dispatched=timezone.now())
    Job.objects.filter(pk=job.pk).update(status=Job.WAITING_GPU)
    client.force_login(customer)
    html = client.get(reverse("web-job-progress", args=[job.code])).content.decode()
    words = text_of(html)
    assert "<" not in words and "  " not in words
    line = queue_line(words)
    assert line.startswith("gpu.sm_90 0 batches on a GPU, 1 waiting. Yours is number 1 in line.")
    assert "Generations" not in line  # the table after the queue is not part of it


def test_text_of_drops_scripts_and_entities():
    # the no-break space reads as a space
    assert text_of("<p>a&nbsp;&amp;<script>var x = '<b>';</script> <b>b</b></p>") == "a & b"
    assert queue_line("no queue here") == "-"


def test_the_driver_talks_http_only():
    with pytest.raises(ValueError):
        Portal("file:///etc/passwd")


def test_other_shapes_replace_the_catalogue_manifests_own():
    from django.conf import settings

    from factory.spec import load_manifest
    from lab.probes.portal_gpu import with_shapes

    text = (settings.BASE_DIR / "factory" / "catalogue" / "layernorm.toml").read_text()
    w = load_manifest(with_shapes(text, "16384x5000,7x4999"))
    assert w.shapes == ({"M": 16384, "N": 5000}, {"M": 7, "N": 4999})
    assert w.name == "layernorm"
    # an operator's own dim names: cross-entropy's rows are M by a vocabulary of V
    text = (settings.BASE_DIR / "factory" / "catalogue" / "cross_entropy.toml").read_text()
    assert load_manifest(with_shapes(text, "4096x50257")).shapes == ({"M": 4096, "V": 50257},)


def test_the_report_lists_every_candidate_with_its_time_or_why_it_was_refused(
    client, customer, orgs, tmp_path, settings
):
    """The report is written from the API's results: a refused candidate shows its reason."""
    import json

    from lab.probes.portal_gpu import report
    from portal import services
    from portal.models import Candidate

    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, candidates=3)
    refused = job.candidates.order_by("id").last()
    Candidate.objects.filter(pk=refused.pk).update(
        status=Candidate.REJECTED, reason="spills: 8 bytes stored", score_us=None
    )
    key, _ = services.api_token_create(user=customer, name="t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    results = {str(job.code): client.get(reverse("api-results", args=[job.code]), **auth).json()}
    final = {str(job.code): client.get(reverse("api-job", args=[job.code]), **auth).json()}
    timeline = tmp_path / "timeline.jsonl"
    timeline.write_text(
        json.dumps(
            {
                "t_s": 0.0,
                "job": str(job.code),
                "status": "review",
                "stage": "done",
                "generations_done": 1,
                "page": "x",
            }
        )
        + "\n"
    )
    report(tmp_path, final, results, timeline, {"catalogue": "softmax"})
    text = (tmp_path / "report.md").read_text()
    assert f"gen 0 {refused.entry}: rejected, spills: 8 bytes stored" in text
    assert text.count(": passed, ") == 2
