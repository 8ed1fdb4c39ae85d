"""The customer's PTX is compiled with nvJitLink at upload: PTX that ptxas refuses is refused
with ptxas's message beside the kernel field (the rest of the form kept, nothing stored), and the
compile runs in a child process with a wall-time cap and a compile slot, so a compile bomb cannot
stall the portal."""

import os
import time
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from factory.spec import SpecError
from portal import services, uploads
from portal.models import Job, Workload

EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
MANIFEST = (EXAMPLES / "softmax_ptx.toml").read_text()
GOOD_PTX = (EXAMPLES / "softmax_ptx.ptx").read_text()
# Parses (one .entry, the declared parameters) but ptxas refuses it: %f99 is past %f<60>.
BAD_PTX = GOOD_PTX.replace(
    "\tmov.f32 \t%f57, 0fFF800000;", "\tmov.f32 \t%f57, 0fFF800000;\n\tmov.f32 \t%f99, %f57;", 1
)


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(uploads, "_LINKED", {})
    monkeypatch.setenv("PTXF_NVRTC_SLOT_DIR", str(tmp_path / "slots"))


def test_the_bad_ptx_differs_from_the_good_one_only_by_the_line_ptxas_refuses():
    assert BAD_PTX != GOOD_PTX and "%f99" in BAD_PTX


def test_good_ptx_compiles_and_reports_its_registers():
    facts = uploads.compile_customer_ptx(GOOD_PTX, target="sm_90")
    assert facts["registers"] > 0 and facts["nvjitlink_version"]


def test_ptx_that_ptxas_refuses_is_refused_with_its_line_and_message():
    with pytest.raises(SpecError) as caught:
        uploads.compile_customer_ptx(BAD_PTX, target="sm_90")
    fields = {f for f, _ in caught.value.errors}
    messages = " ".join(m for _, m in caught.value.errors)
    assert fields == {"baseline.source"}
    assert "does not compile: line" in messages and "%f99" in messages
    assert not uploads._LINKED  # a refusal is not remembered as a clean compile


def test_submit_refuses_bad_ptx_and_stores_nothing(db, orgs, customer):
    with pytest.raises(SpecError, match="does not compile"):
        services.submit(
            org=orgs[0],
            user=customer,
            manifests=[MANIFEST],
            baseline_source=BAD_PTX,
            baseline_filename="softmax_ptx.ptx",
        )
    assert not Workload.objects.exists() and not Job.objects.exists()


def test_submit_compiles_a_good_upload_once_for_all_its_parts(db, orgs, customer, monkeypatch):
    calls = []
    real = uploads.subprocess.Popen

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(uploads.subprocess, "Popen", counting)
    jobs = services.submit(
        org=orgs[0],
        user=customer,
        manifests=[MANIFEST, MANIFEST.replace("customer_softmax", "customer_softmax_b")],
        baseline_source=GOOD_PTX,
        baseline_filename="softmax_ptx.ptx",
    )
    assert len(jobs) == 2 and len(calls) == 1


def test_the_upload_form_shows_the_compiler_message_beside_the_kernel_and_keeps_the_manifest(
    client, customer
):
    client.force_login(customer)
    response = client.post(
        reverse("web-upload"),
        {
            "mode": "manifest",
            "manifest": MANIFEST,
            "generations": "3",
            "baseline": SimpleUploadedFile("softmax_ptx.ptx", BAD_PTX.encode()),
        },
    )
    assert response.status_code == 400
    form = response.context["form"]
    assert "does not compile" in " ".join(form.errors["baseline"])
    assert "manifest" not in form.errors
    assert form["manifest"].value() == MANIFEST  # the text box comes back filled
    assert form["generations"].value() == "3"
    assert not Workload.objects.exists()


def test_the_api_answers_the_compiler_message_in_json(client, customer):
    key, _ = services.api_token_create(user=customer, name="t")
    response = client.post(
        reverse("api-jobs"),
        {"manifest": MANIFEST, "baseline_source": BAD_PTX, "baseline_filename": "softmax_ptx.ptx"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 400
    body = response.json()
    assert any(f == "baseline.source" and "does not compile" in m for f, m in body["errors"])


def test_a_compile_past_its_time_is_killed_and_refused(tmp_path, monkeypatch):
    # A stand-in compiler that hangs (PTXF_PYTHON runs it) and records its pid.
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PTXF_PYTHON", str(fake))
    monkeypatch.setattr(uploads, "JITLINK_TIMEOUT_S", 1.0)
    start = time.monotonic()
    with pytest.raises(SpecError, match="took longer than 1 s"):
        uploads.compile_customer_ptx(GOOD_PTX, target="sm_90")
    assert time.monotonic() - start < 10
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_a_crashed_compiler_is_a_refusal_not_a_500(tmp_path, monkeypatch):
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\nkill -9 $$\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PTXF_PYTHON", str(fake))
    with pytest.raises(SpecError, match="PTX compiler failed"):
        uploads.compile_customer_ptx(GOOD_PTX, target="sm_90")


def test_no_free_compile_slot_refuses_the_upload_with_a_message(monkeypatch):
    import fcntl

    monkeypatch.setenv("PTXF_NVRTC_SLOTS", "1")
    monkeypatch.setenv("PTXF_NVRTC_WAIT_S", "0.3")
    folder = Path(os.environ["PTXF_NVRTC_SLOT_DIR"])
    folder.mkdir(parents=True)
    with open(folder / "slot0", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another upload is compiling
        with pytest.raises(SpecError, match="busy with other uploads"):
            uploads.compile_customer_ptx(GOOD_PTX, target="sm_90")
    assert uploads.compile_customer_ptx(GOOD_PTX, target="sm_90")["registers"] > 0


def test_compiler_messages_are_cut_to_a_readable_list():
    log = "\n".join(f"ptxas application ptx input, line {i}; error   : bad {i}" for i in range(30))
    shown = uploads.compiler_messages(log)
    assert shown[0] == "does not compile: line 0: error: bad 0"
    assert len(shown) == uploads.JITLINK_MAX_MESSAGES + 1 and shown[-1] == "(10 more messages)"
    assert uploads.compiler_messages("") == ["the PTX does not compile (ptxas gave no message)"]
