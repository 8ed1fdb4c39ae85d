"""The home page's cost does not grow with the jobs and workloads it lists (issue 51), and what
it leaves out is nothing it shows."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal.models import Candidate, Generation, Job, Workload, sha256_hex
from tests.portal.conftest import SIMPLE_PTX, make_world_for


def _add_jobs(org, user, n: int, start: int) -> None:
    for i in range(start, start + n):
        manifest = f'name = "op-{i}"\n[[shapes]]\nM = {i + 1}\nN = 4096\n'
        workload = Workload.objects.create(
            org=org, name=f"op-{i}", manifest=manifest, sha256=sha256_hex(manifest), created_by=user
        )
        job = Job.objects.create(workload=workload, status=Job.REVIEW, created_by=user)
        generation = Generation.objects.create(job=job, index=0, status=Generation.DONE)
        best = Candidate.objects.create(
            job=job,
            generation=generation,
            ptx=SIMPLE_PTX,
            ptx_sha256=sha256_hex(f"home {i}"),
            status=Candidate.PASSED,
            score_us=10.0 + i,
        )
        Job.objects.filter(pk=job.pk).update(best_candidate=best)


def _home(client) -> tuple[list[str], str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("web-home"))
    assert response.status_code == 200
    return [q["sql"] for q in ctx.captured_queries], response.content.decode()


def test_the_home_page_queries_do_not_grow_with_its_jobs(
    client, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    make_world_for(orgs[0], customer, "acme-home")
    client.force_login(customer)
    _add_jobs(orgs[0], customer, 3, 0)
    few, _ = _home(client)
    _add_jobs(orgs[0], customer, 30, 3)
    many, page = _home(client)
    assert len(many) == len(few), (len(few), len(many))
    # the newest jobs and workloads are listed, each with its shapes
    assert "op-32" in page and "33x4096" in page
    assert "12.00 µs" not in page  # op-2 is on the second page of jobs
    assert "42.00 µs" in page  # op-32's best time


def test_the_home_job_list_leaves_out_the_best_kernels_ptx(client, orgs, customer):
    make_world_for(orgs[0], customer, "acme-home-ptx")
    _add_jobs(orgs[0], customer, 3, 0)
    client.force_login(customer)
    reads, page = _home(client)
    job_list = [s for s in reads if 'FROM "portal_job"' in s and "LIMIT" in s]
    assert job_list, reads
    assert not [s for s in job_list if '"portal_candidate"."ptx"' in s]
    assert '"portal_candidate"."score_us"' in job_list[0]
    assert "10.00 µs" in page and "In review" in page
