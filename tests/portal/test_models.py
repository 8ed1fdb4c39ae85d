"""Domain methods on the models: transitions, conditional claims, tokens, keys."""

import pytest
from django.db import IntegrityError

from portal.models import ApiToken, Candidate, Job, dims_key, sha256_hex


def test_a_claim_moves_a_job_only_from_the_expected_status(acme_world):
    job = acme_world["job"]  # running
    assert not job.claim([Job.QUEUED], Job.RUNNING)
    assert job.claim([Job.RUNNING], Job.WAITING_GPU, stage=Job.STAGE_GPU)
    job.refresh_from_db()
    assert (job.status, job.stage) == (Job.WAITING_GPU, Job.STAGE_GPU)


def test_a_second_claim_of_the_same_step_gets_nothing(acme_world):
    first = Job.objects.get(pk=acme_world["job"].pk)
    second = Job.objects.get(pk=acme_world["job"].pk)
    assert first.claim([Job.RUNNING], Job.REVIEW)
    assert not second.claim([Job.RUNNING], Job.REVIEW)


def test_finished_jobs_allow_no_further_transition():
    assert Job(status=Job.APPROVED).can_move_to(Job.RUNNING) is False
    assert Job(status=Job.REVIEW).can_move_to(Job.APPROVED) is True


def test_the_same_ptx_is_stored_once_per_job(acme_world):
    candidate = acme_world["candidate"]
    with pytest.raises(IntegrityError):
        Candidate.objects.create(
            job=candidate.job,
            generation=candidate.generation,
            ptx=candidate.ptx,
            ptx_sha256=candidate.ptx_sha256,
        )


def test_an_api_token_is_found_by_its_key_and_only_its_hash_is_stored(customer):
    from portal import services

    key, token = services.api_token_create(user=customer, name="cli")
    assert ApiToken.lookup(key) == token
    assert token.key_sha256 == sha256_hex(key) and key not in token.key_sha256
    assert ApiToken.lookup(key + "x") is None
    assert ApiToken.lookup("Bearer nonsense") is None


def test_dims_key_is_stable_whatever_the_order_of_the_dims():
    assert dims_key({"N": 4096, "M": 2}) == dims_key({"M": 2, "N": 4096}) == "M=2,N=4096"


def test_job_progress_counts_candidates_by_status(acme_world):
    from portal.selectors import job_progress

    progress = job_progress(acme_world["job"])
    assert progress["generations"][0]["by_status"] == {Candidate.PROPOSED: 1}
    assert progress["totals"]["waiting"] == 1
    assert progress["generations_done"] == 0


def test_a_stored_compile_report_reads_as_a_typed_summary(acme_world):
    candidate = acme_world["candidate"]
    assert candidate.compile_summary is None
    candidate.compile_report = {"ok": True, "registers": 40, "spill_store_bytes": 8}
    summary = candidate.compile_summary
    assert (summary.ok, summary.registers, summary.spills, summary.smem_bytes) == (
        True,
        40,
        True,
        0,
    )


@pytest.mark.django_db
def test_an_environment_is_the_machine_and_its_timing_protocol_not_one_batchs_bookkeeping():
    from portal.services import environment_get

    env = {"gpu": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "torch": "2.11.0"}
    a = environment_get(
        env=env | {"worker_restarts": 0, "restart_s": [], "sm_clock_mhz": 1980},
        timing_protocol={"l2_flush": "read"},
    )
    b = environment_get(
        env=env
        | {"worker_restarts": 1, "restart_s": [0.001], "spares_started": 2,
           "restart_log": [{"source": "warm_spare", "switch_s": 0.001}]},
        timing_protocol={"l2_flush": "read"},
    )  # fmt: skip
    c = environment_get(env=env, timing_protocol={"l2_flush": "write"})
    assert a.pk == b.pk
    assert c.pk != a.pk and c.versions["l2_flush"] == "write"
    assert "restart_log" not in a.versions and a.versions["l2_flush"] == "read"


def test_time_left_counts_a_running_generation_from_what_it_has_used():
    from portal.selectors.jobs import eta_text, time_left

    # three generations to run (the current one 20 s in), 60 s each by the median
    assert time_left(3, [50.0, 60.0, 70.0], 20.0) == (160.0, False)
    assert time_left(2, [60.0], None) == (120.0, False)
    # the current generation is past the median: only the ones after it are counted
    assert time_left(2, [60.0], 90.0) == (60.0, True)
    assert time_left(1, [60.0], 90.0) == (0.0, True)
    assert eta_text(160.0, False) == "about 3 min"
    assert eta_text(0.0, True).startswith("any moment")
    assert eta_text(60.0, True) == (
        "about 1 min after this generation, which is taking longer than the others"
    )
