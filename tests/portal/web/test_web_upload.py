"""Uploads: bad input of every kind gets a clear message beside its field and a 4xx, never a
500, and nothing is stored half-way."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from portal.models import Job, Workload
from portal.web.forms import UploadForm, parse_shapes

pytestmark = pytest.mark.django_db

GOOD_TOML = 'name = "x"\n'


def _spec_ready():
    import factory.spec

    return hasattr(factory.spec, "load_manifest")


def _post(client, **fields):
    data = {"mode": "manifest", **fields}
    return client.post(reverse("web-upload"), data)


def _errors(response, field):
    return " ".join(str(e) for e in response.context["form"].errors.get(field, []))


BAD = [
    ("an empty manifest", {"manifest": "  "}, "manifest", "Write a manifest"),
    ("a manifest with NUL bytes", {"manifest": 'name = "x"\x00'}, "manifest", "NUL"),
    ("a manifest with control characters", {"manifest": "name = 1\x07"}, "manifest", "control"),
    ("a huge manifest", {"manifest": "#" * 70_000}, "manifest", "limit"),
    (
        "a manifest file with the wrong extension",
        {"manifest_file": SimpleUploadedFile("m.txt", b"name = 1")},
        "manifest_file",
        ".toml",
    ),
    (
        "a binary manifest file",
        {"manifest_file": SimpleUploadedFile("m.toml", b"\x7fELF\x02\x01\x01\x00\x00")},
        "manifest_file",
        "binary",
    ),
    (
        "a manifest file that is not UTF-8",
        {"manifest_file": SimpleUploadedFile("m.toml", b"name = '\xff\xfe'")},
        "manifest_file",
        "UTF-8",
    ),
    (
        "a huge manifest file",
        {"manifest_file": SimpleUploadedFile("m.toml", b"#" * 70_000)},
        "manifest_file",
        "limit",
    ),
    (
        "a kernel with the wrong extension",
        {"manifest": GOOD_TOML, "baseline": SimpleUploadedFile("k.exe", b"MZ")},
        "baseline",
        ".ptx",
    ),
    (
        "a kernel without an extension",
        {"manifest": GOOD_TOML, "baseline": SimpleUploadedFile("kernel", b".version 8.0")},
        "baseline",
        "extension",
    ),
    (
        "a binary kernel",
        {"manifest": GOOD_TOML, "baseline": SimpleUploadedFile("k.ptx", b"\x7fELF\x00\x00")},
        "baseline",
        "binary",
    ),
    (
        "a huge kernel",
        {"manifest": GOOD_TOML, "baseline": SimpleUploadedFile("k.cu", b"/" * 600_000)},
        "baseline",
        "limit",
    ),
    (
        "an empty kernel",
        {"manifest": GOOD_TOML, "baseline": SimpleUploadedFile("k.cu", b"   \n")},
        "baseline",
        "empty",
    ),
    (
        "a budget of zero generations",
        {"manifest": GOOD_TOML, "generations": "0"},
        "generations",
        "",
    ),
    (
        "a budget that is not a number",
        {"manifest": GOOD_TOML, "generations": "many"},
        "generations",
        "",
    ),
]


@pytest.mark.parametrize("what, fields, field, words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_upload_gets_a_clear_message_beside_its_field_and_a_400(
    client, customer, what, fields, field, words
):
    client.force_login(customer)
    response = _post(client, **fields)
    assert response.status_code == 400, what
    message = _errors(response, field)
    assert message and words in message, (what, response.context["form"].errors)
    assert f'id="errors-{field}"' in response.content.decode()
    assert not Workload.objects.exists() and not Job.objects.exists()


def test_catalogue_mode_needs_an_operator_and_well_formed_shapes(client, customer):
    client.force_login(customer)
    response = client.post(
        reverse("web-upload"), {"mode": "catalogue", "operator": "", "shapes": "M=abc"}
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "operator" in errors and "M" in " ".join(errors["shapes"])


def test_an_unknown_mode_is_a_400(client, customer):
    client.force_login(customer)
    assert client.post(reverse("web-upload"), {"mode": "exec"}).status_code == 400


def test_a_request_body_over_the_limit_is_a_413_not_a_500(client, customer, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client.force_login(customer)
    response = _post(client, manifest="#" * 5000)
    assert response.status_code == 413  # Payload Too Large (portal/middleware.py)


def test_the_upload_page_offers_a_sample_manifest(client, customer):
    client.force_login(customer)
    response = client.get(reverse("web-upload"))
    assert response.status_code == 200
    assert client.get(reverse("web-upload") + "?sample=../../etc/passwd").status_code == 404


def test_spec_errors_are_attached_to_the_field_they_concern():
    form = UploadForm(
        data={"mode": "catalogue", "operator": "softmax", "shapes": "M=1 N=2"},
        catalogue_names=["softmax"],
    )
    assert form.is_valid(), form.errors
    form.add_spec_errors(
        [
            ("shapes[0].N", "must be at least 32"),
            ("inputs.x.dtype", "unknown dtype"),
            ("baseline.entry", "no .entry named softmax_k"),
            ("outputs.y.expr", "unknown name z"),
        ]
    )
    assert "shapes[0].N: must be at least 32" in form.errors["shapes"]
    assert "inputs.x.dtype: unknown dtype" in form.errors["dtype"]
    assert "baseline.entry: no .entry named softmax_k" in form.errors["baseline"]
    assert "outputs.y.expr: unknown name z" in form.errors["operator"]

    manifest_form = UploadForm(data={"mode": "manifest", "manifest": "x"})
    assert manifest_form.is_valid()
    manifest_form.add_spec_errors([("outputs.y.expr", "unknown name z"), ("toml", "line 3")])
    assert len(manifest_form.errors["manifest"]) == 2


def test_shapes_are_parsed_from_lines_or_semicolons():
    assert parse_shapes("M=1 N=2; M=3,N=4\nM=5 N=6") == [
        {"M": 1, "N": 2},
        {"M": 3, "N": 4},
        {"M": 5, "N": 6},
    ]


def test_a_manifest_the_spec_refuses_is_shown_beside_the_manifest_and_nothing_is_stored(
    client, customer
):
    if not _spec_ready():
        pytest.skip("factory.spec has not landed")
    client.force_login(customer)
    response = _post(client, manifest='name = "x"\n[[outputs]]\nname = 3\n')
    assert response.status_code == 400
    assert response.context["form"].errors["manifest"]
    assert not Workload.objects.exists() and not Job.objects.exists()


def test_a_good_manifest_creates_a_workload_and_a_job_and_redirects_to_it(
    client, customer, settings
):
    if not _spec_ready():
        pytest.skip("factory.spec has not landed")
    from factory.spec import catalogue_manifest

    settings.GPU_DISPATCH = False
    client.force_login(customer)
    response = _post(client, manifest=catalogue_manifest("softmax"), generations="1")
    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get()
    assert response["Location"] == reverse("web-job", args=[job.code])
    assert job.max_generations == 1 and job.workload.org.name == "Acme"


def test_a_catalogue_operator_with_shapes_and_dtype_makes_a_valid_manifest(client, customer):
    if not _spec_ready():
        pytest.skip("factory.spec has not landed")
    client.force_login(customer)
    response = client.post(
        reverse("web-upload"),
        {"mode": "catalogue", "operator": "softmax", "shapes": "M=128 N=1024", "dtype": "fp16"},
    )
    assert response.status_code == 302, response.context["form"].errors
    spec = Workload.objects.get().spec()
    assert [dict(s) for s in spec.shapes] == [{"M": 128, "N": 1024}]
    assert {t.dtype for t in spec.inputs if t.dtype in ("fp32", "bf16", "fp16")} == {"fp16"}


def test_shapes_of_several_row_lengths_become_a_workload_and_a_job_per_length(
    client, customer, settings
):
    if not _spec_ready():
        pytest.skip("factory.spec has not landed")
    from factory.spec import catalogue_manifest

    settings.GPU_DISPATCH = False
    client.force_login(customer)
    page = client.get(reverse("web-upload"))
    assert page.context["form"]["per_row_length"].value()  # ticked unless the customer unticks
    manifest = catalogue_manifest("layernorm")  # 16384x4096, 16384x8192, 32768x4096
    response = _post(client, manifest=manifest, per_row_length="on")
    assert response.status_code == 302 and response["Location"] == reverse("web-home")
    got = {
        w.spec().shapes[0]["N"]: [dict(s) for s in w.spec().shapes] for w in Workload.objects.all()
    }
    assert got == {
        4096: [{"M": 16384, "N": 4096}, {"M": 32768, "N": 4096}],
        8192: [{"M": 16384, "N": 8192}],
    }
    assert Job.objects.count() == 2
    home = client.get(reverse("web-home")).content.decode()  # the two told apart by shapes
    assert "16384x4096, 32768x4096" in home and "16384x8192" in home
    # Unticked (a form posted without the box): one workload, one kernel for every shape.
    response = _post(client, manifest=manifest)
    assert response.status_code == 302 and Workload.objects.count() == 3
    assert len(Workload.objects.order_by("-created").first().spec().shapes) == 3


def test_a_catalogue_operator_with_a_blank_shape_box_takes_its_own_shapes(client, customer):
    if not _spec_ready():
        pytest.skip("factory.spec has not landed")
    from factory.spec import load_catalogue

    client.force_login(customer)
    page = client.get(reverse("web-upload")).content.decode()
    assert '"rmsnorm": "M=16384 N=4096\\nM=16384 N=8192\\nM=32768 N=4096"' in page
    response = client.post(
        reverse("web-upload"),
        {"mode": "catalogue", "operator": "rmsnorm", "shapes": "  \n", "dtype": "bf16"},
    )
    assert response.status_code == 302, response.context["form"].errors
    spec = Workload.objects.get().spec()
    own = load_catalogue()["rmsnorm"]
    assert [dict(s) for s in spec.shapes] == [dict(s) for s in own.shapes]
    assert [dict(s) for s in spec.heldout_shapes] == [dict(s) for s in own.heldout_shapes]
