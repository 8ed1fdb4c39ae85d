"""Issue 52, "every page at least 4 of 5": what a new customer would stumble on, said plainly.
A job whose baselines were all unavailable says that no baseline was measured (not "against the
strongest measured baseline, <the first one asked for>"); timings without byte counts draw no
empty bandwidth chart; the job and review pages say where the kernel was measured."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from portal import services
from portal.models import Job, Membership
from tests.portal.web.world import job_in_review, job_on_the_gpu

pytestmark = pytest.mark.django_db

CPU_ENV = {
    "gpu": "CPU PTX interpreter factory.ptxsim, no GPU",
    "sm": "sm_90 emulated",
    "driver": "none",
}


def _reviewed(org, user, change):
    """A job in review whose results file was first passed through `change` (edits in place)."""
    job, results = job_on_the_gpu(org, user)
    change(results)
    services.results_record(results=results)
    services.generation_finish(generation=job.generations.get(index=0))
    job.refresh_from_db()
    assert job.status == Job.REVIEW, job.status
    return job


def _baselines_unavailable(results):
    results["baselines"] = [
        {
            "name": name,
            "version": "",
            "config": {},
            "status": "unavailable",
            "reason": "no GPU: the CPU interpreter cannot run it",
            "verification": [],
            "timing": [],
        }
        for name in ("liger", "torch_compile")
    ]


def _on_the_cpu(results):
    _baselines_unavailable(results)
    results["env"] = dict(CPU_ENV)
    for entry in results["candidates"]:
        for t in entry["timing"]:
            t.pop("bytes", None)
            t.pop("tbps", None)
            t.pop("sm_clock_mhz", None)


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


def test_a_job_without_a_measured_baseline_says_so_instead_of_naming_one(
    client, orgs, customer, media
):
    job = _reviewed(orgs[0], customer, _baselines_unavailable)
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert "No baseline was measured" in page
    assert "Against the strongest measured baseline" not in page
    assert "no baseline time at this shape" not in page
    # each baseline asked for is named with why it has no time
    assert "<code>liger</code>, <code>torch_compile</code>: unavailable" in page
    assert "the CPU interpreter cannot run it" in page


def test_a_job_with_a_measured_baseline_still_compares_against_it(client, orgs, customer, media):
    job = job_in_review(orgs[0], customer)
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert "Against the strongest measured baseline, torch_compile" in page
    assert "No baseline was measured" not in page
    assert 'id="measured-on">Measured on NVIDIA H200 (sm_90, driver 580.159.04)' in page


def test_timings_without_byte_counts_draw_no_empty_bandwidth_chart(client, orgs, customer, media):
    job = _reviewed(orgs[0], customer, _on_the_cpu)
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert "Achieved bandwidth" not in page and "fraction of the measured copy ceiling" not in page
    assert 'id="bandwidth-missing"' in page
    # nor a chart "against baselines" holding only our own bars
    assert "Candidate against baselines" not in page and 'id="baselines-missing"' in page
    assert "Measured on CPU PTX interpreter factory.ptxsim, no GPU" in page
    with_bytes = job_in_review(orgs[0], customer, name="softmax2")
    page = client.get(reverse("web-job", args=[with_bytes.code])).content.decode()
    assert "copy ceiling" in page and 'id="bandwidth-missing"' not in page
    assert "Candidate against baselines" in page and 'id="baselines-missing"' not in page


def test_the_review_checklist_says_no_baseline_was_measured(
    client, orgs, customer, engineer, media
):
    job = _reviewed(orgs[0], customer, _baselines_unavailable)
    client.force_login(engineer)
    page = client.get(reverse("web-review", args=[job.code])).content.decode()
    assert "no baseline was measured" in page
    assert "has no time at some shapes" not in page
    # baselines refused for one reason are named together, the reason said once
    assert "<code>liger</code>, <code>torch_compile</code>: unavailable" in page
    assert page.count("the CPU interpreter cannot run it") == 1
    picked = client.get(reverse("web-review", args=[job.code]), {"baseline": "liger"})
    text = picked.content.decode()
    assert "liger was not measured (unavailable: no GPU: the CPU interpreter cannot run it)" in text


def test_the_review_page_says_where_the_kernel_was_measured(
    client, orgs, customer, engineer, media
):
    on_cpu = _reviewed(orgs[0], customer, _on_the_cpu)
    on_gpu = job_in_review(orgs[0], customer, name="softmax2")
    client.force_login(engineer)
    page = client.get(reverse("web-review", args=[on_cpu.code])).content.decode()
    assert "Measured on CPU PTX interpreter factory.ptxsim, no GPU (sm_90 emulated" in page
    assert '<option value="" selected>none measured</option>' in page
    assert "Candidate against baselines" not in page and 'id="no-baseline-chart"' in page
    page = client.get(reverse("web-review", args=[on_gpu.code])).content.decode()
    assert "Measured on NVIDIA H200 (sm_90, driver 580.159.04)." in page
    assert "none measured" not in page and 'id="no-baseline"' not in page


def test_the_candidate_page_lists_what_the_static_review_checked(client, orgs, customer, media):
    job = _reviewed(orgs[0], customer, _on_the_cpu)
    best = job.best_candidate
    best.compile_report = {
        "ok": True,
        "arch": "sm_90",
        "registers": 64,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "stack_bytes": 0,
        "smem_bytes": 0,
    }
    best.review = {"ok": True, "reason": ""}
    best.entry = "attention_softmax_ct8r16v8c4n_nlno_with_a_long_tail"
    best.save()
    client.force_login(customer)
    page = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    checks = page.split('id="review-checks"', 1)[1].split("</table>", 1)[0]
    # 256 threads x 64 registers: 16,384 registers a block, four blocks in 65,536: 32 warps
    assert "256 threads × 64 registers, 0 B shared: 32 warps resident per SM" in checks
    assert "0 B spilled, 0 B reloaded, 0 B stack frame" in checks
    assert "allowed with a warning" not in checks
    # the long entry may break inside its card; no SM clock recorded reads as a dash, not "– MHz"
    assert '<td class="break"><code>attention_softmax_ct8r16v8c4n_nlno' in page
    assert "– MHz" not in page
    best.review = {"ok": True, "reason": "warning: scalar global accesses where ..."}
    best.save()
    page = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    assert "allowed with a warning (below)" in page and "warning: scalar global accesses" in page
    best.review = {"ok": False, "reason": "spills: 8 bytes stored, 8 bytes loaded"}
    best.save()
    page = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    assert 'id="review-checks"' not in page and "spills: 8 bytes stored" in page


def test_the_upload_page_offers_the_manifest_file_before_the_text_box(client, customer):
    client.force_login(customer)
    page = client.get(reverse("web-upload")).content.decode()
    file_input = page.index('id="id_manifest_file"')
    text_box = page.index('id="id_manifest"')
    assert file_input < text_box
    assert "The file that ptxf import wrote" in page


def test_the_demo_customer_is_an_admin_of_acme_and_sees_the_team_page(client, settings, tmp_path):
    settings.DEMO_ACCOUNTS = True
    settings.GPU_DISPATCH = False
    settings.MEDIA_ROOT = tmp_path / "media"
    call_command("seed_demo", stdout=StringIO())
    demo = Membership.objects.get(user__username="demo")
    assert demo.org.name == "Acme" and demo.role == Membership.ROLE_ADMIN
    assert not demo.user.is_staff and not demo.user.is_superuser
    client.force_login(demo.user)
    home = client.get(reverse("web-home")).content.decode()
    assert reverse("web-team") in home
    assert client.get(reverse("web-team")).status_code == 200
    # the outsider stays a plain customer of its own organisation: no Team page
    outsider = Membership.objects.get(user__username="outsider")
    assert outsider.role == Membership.ROLE_CUSTOMER
    client.force_login(outsider.user)
    assert reverse("web-team") not in client.get(reverse("web-home")).content.decode()
