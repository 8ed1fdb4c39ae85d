"""Issue 52, the upload page: a per-row-length split with a [baseline], names of the parts,
what a validation error keeps, and the target the page talks about."""

from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from portal.models import Job, Workload

pytestmark = pytest.mark.django_db

EXAMPLES = Path(__file__).resolve().parents[3] / "factory" / "examples"


def _softmax_with_baseline_at_two_row_lengths() -> str:
    text = (EXAMPLES / "softmax_ptx.toml").read_text()
    return text.replace("M = 32768\nN = 4096", "M = 16384\nN = 8192")


def _ptx() -> bytes:
    return (EXAMPLES / "softmax_ptx.ptx").read_bytes()


def test_a_kernel_per_row_length_is_honoured_when_the_manifest_has_a_baseline(
    client, customer, settings
):
    settings.GPU_DISPATCH = False
    client.force_login(customer)
    response = client.post(
        reverse("web-upload"),
        {
            "mode": "manifest",
            "manifest": _softmax_with_baseline_at_two_row_lengths(),
            "baseline": SimpleUploadedFile("softmax_ptx.ptx", _ptx()),
            "per_row_length": "on",
        },
    )
    assert response.status_code == 302, response.context["form"].errors
    assert Workload.objects.count() == 2 and Job.objects.count() == 2
    assert all(w.baseline_source for w in Workload.objects.all())


def test_workloads_made_from_one_upload_have_names_that_tell_them_apart(client, customer, settings):
    settings.GPU_DISPATCH = False
    client.force_login(customer)
    client.post(
        reverse("web-upload"),
        {
            "mode": "manifest",
            "manifest": _softmax_with_baseline_at_two_row_lengths(),
            "baseline": SimpleUploadedFile("softmax_ptx.ptx", _ptx()),
            "per_row_length": "on",
        },
    )
    names = sorted(Workload.objects.values_list("name", flat=True))
    assert names == ["customer_softmax_N4096", "customer_softmax_N8192"]


def test_a_validation_error_keeps_the_manifest_text_and_the_uploaded_files(client, customer):
    client.force_login(customer)
    manifest = 'name = "kept"\nthis is not toml ['
    response = client.post(
        reverse("web-upload"),
        {
            "mode": "manifest",
            "manifest": manifest,
            "baseline": SimpleUploadedFile("softmax_ptx.ptx", _ptx()),
        },
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "this is not toml [" in page  # the text box still holds what was typed
    assert "Kept from your last try: <code>softmax_ptx.ptx</code>" in page
    # Posting again without choosing the file once more still carries the kept kernel.
    kept = response.context["form"]["kept_baseline"].value()
    assert kept
    good = _softmax_with_baseline_at_two_row_lengths()
    response = client.post(
        reverse("web-upload"),
        {"mode": "manifest", "manifest": good, "kept_baseline": kept},
    )
    assert response.status_code == 302, response.context["form"].errors
    assert Workload.objects.get().baseline_filename == "softmax_ptx.ptx"


def test_a_kept_file_cannot_be_forged_by_the_browser(client, customer):
    client.force_login(customer)
    response = client.post(
        reverse("web-upload"),
        {
            "mode": "manifest",
            "manifest": _softmax_with_baseline_at_two_row_lengths(),
            "kept_baseline": "eyJmaWxlbmFtZSI6ICJ4LnB0eCJ9:forged",
        },
    )
    assert response.status_code == 400
    assert Workload.objects.count() == 0


def test_the_upload_page_names_the_target_it_will_run_on_not_always_an_h200(client, customer):
    client.force_login(customer)
    page = client.get(reverse("web-upload")).content.decode()
    assert "An H200 verifies" not in page
    assert "The target GPU" in page
    form = client.get(reverse("web-upload")).context["form"]
    assert "target" in form.fields  # the catalogue tab offers a choice of GPU


def test_a_manifest_file_refused_by_the_spec_comes_back_as_text_in_the_box(client, customer):
    client.force_login(customer)
    text = 'name = "from_a_file"\nnot toml ['
    response = client.post(
        reverse("web-upload"),
        {"mode": "manifest", "manifest_file": SimpleUploadedFile("m.toml", text.encode())},
    )
    assert response.status_code == 400
    assert response.context["form"]["manifest"].value() == text
