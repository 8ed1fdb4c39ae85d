"""The `ptxf` client against the real API on a live server."""

import io
import zipfile

import pytest

from portal import cli, services
from portal.artifacts import verify_checksums
from portal.delivery import decide_and_deliver
from tests.portal.web.world import job_in_review


@pytest.fixture
def api(live_server, customer, monkeypatch):
    key, _ = services.api_token_create(user=customer, name="cli")
    monkeypatch.setenv("PTXF_TOKEN", key)
    monkeypatch.setenv("PTXF_URL", live_server.url)

    def run(*argv):
        out = io.StringIO()
        code = cli.main(list(argv), out=out)
        return code, out.getvalue()

    return run


@pytest.fixture
def job(orgs, customer, settings, tmp_path, transactional_db):
    settings.MEDIA_ROOT = tmp_path / "media"
    return job_in_review(orgs[0], customer)


def test_status_prints_the_jobs_progress(api, job):
    code, out = api("status", str(job.code))
    assert code == 0
    assert "status    review" in out and "1/1 generations" in out


def test_results_print_verification_and_speedups(api, job):
    code, out = api("results", str(job.code))
    assert code == 0
    assert "against torch_compile" in out and "2.00x" in out
    assert out.count("ok  rel_err") == 3


def test_download_of_an_unapproved_job_fails_with_the_servers_message(api, job, tmp_path, capsys):
    code, _ = api("download", str(job.code), "-o", str(tmp_path / "k.zip"))
    assert code == 1
    assert "HTTP 409" in capsys.readouterr().err
    assert not (tmp_path / "k.zip").exists() and not (tmp_path / "k.zip.part").exists()


def test_download_of_an_approved_job_writes_a_zip_whose_checksums_verify(
    api, job, engineer, tmp_path
):
    decide_and_deliver(job=job, reviewer=engineer, decision="approve", comment="", checklist={})
    target = tmp_path / "k.zip"
    code, out = api("download", str(job.code), "-o", str(target))
    assert code == 0 and "matches the server's checksum" in out
    data = target.read_bytes()
    assert verify_checksums(data) == []
    assert "kernel.ptx" in zipfile.ZipFile(io.BytesIO(data)).namelist()


def test_another_organisations_job_is_not_found(api, orgs, outsider, settings, tmp_path, capsys):
    settings.MEDIA_ROOT = tmp_path / "media"
    theirs = job_in_review(orgs[1], outsider)
    assert api("status", str(theirs.code))[0] == 1
    assert "HTTP 404" in capsys.readouterr().err


def test_a_missing_token_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.delenv("PTXF_TOKEN", raising=False)
    assert cli.main(["status", "abc"], out=io.StringIO()) == 2
    assert "PTXF_TOKEN" in capsys.readouterr().err


def test_an_unreachable_server_is_exit_code_3(monkeypatch, capsys):
    monkeypatch.setenv("PTXF_TOKEN", "ptxf_x_y")
    assert cli.main(["--url", "http://127.0.0.1:9", "status", "abc"], out=io.StringIO()) == 3


def test_the_api_root_is_found_from_the_portal_url():
    assert cli.api_base("http://h:8000") == "http://h:8000/api/v1/"
    assert cli.api_base("http://h:8000/api/v1/") == "http://h:8000/api/v1/"
    with pytest.raises(cli.CliError):
        cli.api_base("file:///etc/passwd")


def test_submit_sends_the_manifest_and_prints_the_job(api, tmp_path, settings, transactional_db):
    import factory.spec

    if not hasattr(factory.spec, "catalogue_manifest"):
        pytest.skip("factory.spec has not landed")
    settings.GPU_DISPATCH = False
    manifest = tmp_path / "softmax.toml"
    manifest.write_text(factory.spec.catalogue_manifest("softmax"))
    code, out = api("submit", str(manifest), "--generations", "1")
    assert code == 0
    from portal.models import Job

    assert Job.objects.filter(code=out.strip()).exists()


def test_submit_per_row_length_makes_a_job_for_each_row_length(
    api, tmp_path, settings, transactional_db
):
    import factory.spec

    if not hasattr(factory.spec, "catalogue_manifest"):
        pytest.skip("factory.spec has not landed")
    settings.GPU_DISPATCH = False
    manifest = tmp_path / "rmsnorm.toml"
    manifest.write_text(factory.spec.catalogue_manifest("rmsnorm"))  # rows of 4096 and 8192
    code, out = api("submit", str(manifest), "--generations", "1", "--per-row-length")
    assert code == 0
    from portal.models import Job

    jobs = [Job.objects.get(code=line) for line in out.split()]
    assert sorted({d["N"] for d in j.workload.spec().shapes} for j in jobs) == [{4096}, {8192}]


def test_rerun_starts_another_job_and_cancel_stops_it(api, job):
    code, out = api("rerun", str(job.workload.code), "--generations", "2")
    assert code == 0
    new = job.workload.jobs.exclude(pk=job.pk).get()
    assert out.strip() == str(new.code) and new.max_generations == 2
    code, out = api("cancel", str(new.code))
    assert code == 0 and "status    cancelled" in out and "stopped   cancelled by alice" in out
    new.refresh_from_db()
    assert new.status == "cancelled"


def test_stop_of_a_job_not_searching_prints_the_servers_reason(api, job, capsys):
    code, _ = api("stop", str(job.code))
    assert code == 1
    assert "HTTP 409: The job is in review, not searching." in capsys.readouterr().err


def test_status_says_where_a_waiting_jobs_batch_stands_in_the_gpu_queue():
    def status(**queue):
        info = {
            "job": "j",
            "name": "softmax",
            "status": "waiting_gpu",
            "done": False,
            "gpu_queue": {"arch": "sm_90", "dispatch": True, **queue},
        }
        out = io.StringIO()
        cli._print_status(info, out)
        return [line for line in out.getvalue().splitlines() if line.startswith("gpu ")]

    assert status(position=2) == ["gpu       gpu.sm_90: number 2 in line"]
    assert status(mine_running=True) == ["gpu       gpu.sm_90: on a GPU now"]
    assert status(position=1, idle=True) == [
        "gpu       gpu.sm_90: number 1 in line; no GPU worker has taken a batch from this queue yet"
    ]
    assert status(position=1, idle=True, last_taken="2026-12-05T09:00:00+00:00") == [
        "gpu       gpu.sm_90: number 1 in line; no GPU worker has taken a batch from this queue "
        "lately"
    ]
    assert status(dispatch=False) == [
        "gpu       gpu.sm_90: waiting for a results file from an air-gapped GPU host"
    ]


def test_results_list_every_candidate_on_request(api, orgs, customer, settings, tmp_path):
    from portal.models import Candidate

    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, candidates=3)
    refused = job.candidates.order_by("id").last()
    Candidate.objects.filter(pk=refused.pk).update(
        status=Candidate.REJECTED, reason="spills: 8 bytes stored", score_us=None
    )
    code, out = api("results", str(job.code))
    assert code == 0 and "candidates (" not in out
    code, out = api("results", str(job.code), "--candidates")
    assert code == 0 and "candidates (3)" in out
    assert f"{refused.entry}" in out and "rejected  spills: 8 bytes stored" in out
    assert out.count("passed ") == 2
