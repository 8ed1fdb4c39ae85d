"""Help inside the portal: the references rendered, the gallery of examples one click from the
upload form, the meaning of every verdict, chart and schedule label, linked from where they
appear."""

import pytest
from django.urls import reverse

from portal.models import Candidate, Workload
from portal.web.markdown import render
from tests.portal.web.world import job_in_review, job_on_the_gpu

pytestmark = pytest.mark.django_db


def test_the_manifest_reference_and_the_pytorch_guide_are_pages(client, customer):
    client.force_login(customer)
    page = client.get(reverse("web-help-doc", args=["manifest"])).content.decode()
    assert '<h1 id="workload-manifests">Workload manifests</h1>' in page
    assert '<pre class="lang-toml">' in page
    page = client.get(reverse("web-help-doc", args=["pytorch"])).content.decode()
    assert "ptxf import" in page
    assert client.get(reverse("web-help-doc", args=["secrets"])).status_code == 404


def test_the_markdown_renderer_escapes_what_it_does_not_write():
    html = render("# T\n\nA <script>x</script> and `<b>` and **bold** [a](#t)\n")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<code>&lt;b&gt;</code>" in html and "<strong>bold</strong>" in html
    assert '<a href="#t">a</a>' in html


def test_every_example_opens_in_the_upload_form_with_its_kernel(client, customer, settings):
    from portal.web import help as h

    settings.GPU_DISPATCH = False
    client.force_login(customer)
    gallery = client.get(reverse("web-help-examples")).content.decode()
    for stem in h.examples():
        assert f"?example={stem}" in gallery
    page = client.get(reverse("web-upload") + "?example=softmax_ptx")
    form = page.context["form"]
    assert 'name = "customer_softmax"' in form["manifest"].value()
    assert "Kept from your last try: <code>softmax_ptx.ptx</code>" in page.content.decode()
    # Starting it as it is works: the kernel file came along.
    response = client.post(
        reverse("web-upload"),
        {
            "mode": "manifest",
            "manifest": form["manifest"].value(),
            "kept_baseline": form["kept_baseline"].value(),
        },
    )
    assert response.status_code == 302, response.context["form"].errors
    assert Workload.objects.get().baseline_filename == "softmax_ptx.ptx"
    assert client.get(reverse("web-upload") + "?example=../etc").status_code == 404


def test_the_help_page_says_what_every_verdict_chart_and_schedule_label_means(client, customer):
    from factory import families

    client.force_login(customer)
    page = client.get(reverse("web-help")).content.decode()
    for status, _ in Candidate.STATUS_CHOICES:
        assert f'id="verdict-{status}"' in page
    for key in ("generations", "baselines", "bandwidth", "correctness", "costmodel"):
        assert f'id="chart-{key}"' in page
    for name in families.names():
        assert f'id="schedule-{name}"' in page
    assert families.get("matmul").legend[:30] in page


def test_help_is_linked_from_the_upload_page_the_candidates_and_the_charts(
    client, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    client.force_login(customer)
    upload = client.get(reverse("web-upload")).content.decode()
    assert reverse("web-help-doc", args=["manifest"]) in upload
    assert reverse("web-help-examples") in upload
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert reverse("web-help") + "#verdicts" in page and reverse("web-help") + "#charts" in page


def test_a_job_without_timings_shows_no_empty_chart_cards(client, orgs, customer):
    job, _ = job_on_the_gpu(orgs[0], customer)
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert 'class="card chart"' not in page
    assert "appear once the first generation has been timed" in page
