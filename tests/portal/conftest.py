"""Shared personas and a small world of objects for the portal tests.

A customer and an engineer of Acme, and an outsider: a customer of Globex. Each organisation has a
workload, a job, a candidate and (for Acme) an approved job with an artifact, made straight
through the ORM so the access tests do not depend on the factory.
"""

from __future__ import annotations

import pytest

SIMPLE_PTX = """//
.version 8.0
.target sm_90
.address_size 64

.visible .entry copy_k(.param .u64 x, .param .u64 y, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f1, [%rd6];
    st.global.f32 [%rd7], %f1;
DONE:
    ret;
}
"""


@pytest.fixture
def orgs(db):
    from portal import services

    return services.organisation_create(name="Acme"), services.organisation_create(name="Globex")


def _user(username, org, role, staff=False):
    from django.contrib.auth import get_user_model

    from portal import services

    user = get_user_model().objects.create_user(
        username=username, password=f"{username}-pass", is_staff=staff
    )
    services.membership_set(user=user, org=org, role=role)
    return user


@pytest.fixture
def customer(orgs):
    return _user("alice", orgs[0], "customer")


@pytest.fixture
def engineer(orgs):
    return _user("erin", orgs[0], "engineer", staff=True)


@pytest.fixture
def outsider(orgs):
    return _user("oscar", orgs[1], "customer")


def make_world_for(org, user, name):
    """A workload, a running job with a candidate, and an approved job with an artifact."""
    from django.core.files.base import ContentFile

    from portal.models import (
        Artifact,
        Candidate,
        Generation,
        Job,
        Workload,
        sha256_hex,
    )

    manifest = f'name = "{name}"\n'
    workload = Workload.objects.create(
        org=org, name=name, manifest=manifest, sha256=sha256_hex(manifest), created_by=user
    )
    job = Job.objects.create(workload=workload, status=Job.RUNNING, created_by=user)
    generation = Generation.objects.create(job=job, index=0)
    candidate = Candidate.objects.create(
        job=job, generation=generation, ptx=SIMPLE_PTX, ptx_sha256=sha256_hex(SIMPLE_PTX)
    )
    approved = Job.objects.create(workload=workload, status=Job.APPROVED, created_by=user)
    g2 = Generation.objects.create(job=approved, index=0)
    winner = Candidate.objects.create(
        job=approved,
        generation=g2,
        ptx=SIMPLE_PTX,
        ptx_sha256=sha256_hex(SIMPLE_PTX),
        status=Candidate.PASSED,
    )
    artifact = Artifact(
        job=approved, candidate=winner, filename="kernel.zip", sha256=sha256_hex(b"zip")
    )
    artifact.file.save("kernel.zip", ContentFile(b"zip"), save=True)
    return {
        "workload": workload,
        "job": job,
        "candidate": candidate,
        "approved_job": approved,
        "artifact": artifact,
    }


@pytest.fixture
def submit_to_gpu_stage(customer, orgs, settings, django_capture_on_commit_callbacks):
    """submit(manifest_text, seed=7) -> the job, once its pipeline has run (tasks eager) as far
    as it goes without a GPU: its batch waits for a results file."""
    from portal import services
    from portal.celery import app

    settings.GPU_DISPATCH = False  # no GPU here: the batch waits for a results file
    app.conf.task_always_eager = True

    def submit(manifest: str, seed: int = 7):
        with django_capture_on_commit_callbacks(execute=True):
            workload = services.workload_create(org=orgs[0], user=customer, manifest=manifest)
            job = services.job_create(
                workload=workload, user=customer, max_generations=1, population=3, seed=seed
            )
        job.refresh_from_db()
        return job

    try:
        yield submit
    finally:
        app.conf.task_always_eager = False


@pytest.fixture
def acme_world(customer, orgs, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return make_world_for(orgs[0], customer, "acme-softmax")


@pytest.fixture
def globex_world(outsider, orgs, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return make_world_for(orgs[1], outsider, "globex-softmax")


@pytest.fixture(autouse=True)
def _fast_password_hashing(request):
    # The default hasher costs ~0.3 s per password by design; tests make many users. GPU hosts
    # have no Django (nor pytest-django): the GPU tests under tests/portal need neither.
    if not request.config.pluginmanager.hasplugin("django"):
        return
    settings = request.getfixturevalue("settings")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
