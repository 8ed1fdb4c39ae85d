"""Facts the pages show are derived once, when the row is written, and stored: a workload's row
lengths, a candidate's schedule label, the cost model's rank correlation per generation and per
job. The migration that added them fills them for rows that already existed, whatever those
rows hold."""

import importlib

import pytest
from django.apps import apps

from factory import families
from portal import derived, services
from portal.models import Candidate, Generation, Job, Workload, sha256_hex
from tests.portal.conftest import SIMPLE_PTX
from tests.portal.web.world import job_on_the_gpu

pytestmark = pytest.mark.django_db


def test_a_stored_workload_carries_its_row_lengths(orgs, customer):
    from factory.spec import catalogue_manifest

    workload = services.workload_create(
        org=orgs[0], user=customer, manifest=catalogue_manifest("rmsnorm")
    )
    workload.refresh_from_db()
    assert workload.row_lengths == [4096, 8192]


def test_a_stored_candidate_carries_its_schedule_label_from_its_family(orgs, customer):
    from factory.spec import catalogue_manifest

    workload = services.workload_create(
        org=orgs[0], user=customer, manifest=catalogue_manifest("softmax")
    )
    job = services.job_create(workload=workload, user=customer, start=False)
    generation = Generation.objects.create(job=job, index=0)
    fam, ir = families.family_for(workload.spec())
    schedule = fam.space(ir, [dict(d) for d in workload.spec().shapes])[0]
    draft = {"ptx": SIMPLE_PTX, "entry": "copy_k", "schedule": schedule}
    candidate = services.candidate_from_draft(job=job, generation=generation, draft=draft)
    stored = Candidate.objects.get(pk=candidate.pk)
    assert stored.schedule_label == families.label(stored.schedule)
    assert stored.schedule_label and stored.schedule_label != derived.HAND_WRITTEN


def test_a_candidate_without_a_schedule_is_labelled_hand_written(orgs, customer):
    job, _ = job_on_the_gpu(orgs[0], customer)
    ptx = SIMPLE_PTX.replace("//", "// hand", 1)
    draft = {"ptx": ptx, "entry": "copy_k"}
    candidate = services.candidate_from_draft(
        job=job, generation=job.generations.get(), draft=draft
    )
    assert candidate.schedule_label == derived.HAND_WRITTEN


def test_a_finished_generation_stores_how_well_the_cost_model_ranked_it(orgs, customer):
    job, results = job_on_the_gpu(orgs[0], customer, candidates=4)  # measured 10, 11, 12, 13 us
    for c, predicted in zip(job.candidates.order_by("pk"), (5.0, 6.0, 9.0, None), strict=True):
        Candidate.objects.filter(pk=c.pk).update(predicted_us=predicted)
    services.results_record(results=results)
    services.generation_finish(generation=job.generations.get(index=0))
    job.refresh_from_db()
    assert job.generations.get(index=0).model_rho == pytest.approx(1.0)
    assert job.model_rho == pytest.approx(1.0)


def test_with_fewer_than_three_ranked_candidates_no_correlation_is_stored(orgs, customer):
    job, results = job_on_the_gpu(orgs[0], customer, candidates=2)
    services.results_record(results=results)
    services.generation_finish(generation=job.generations.get(index=0))
    job.refresh_from_db()
    assert job.model_rho is None and job.generations.get().model_rho is None


def test_the_migration_backfills_old_rows_and_survives_bad_ones(orgs, customer):
    from factory.spec import catalogue_manifest

    migration = importlib.import_module("portal.migrations.0004_derived_facts")
    good = catalogue_manifest("rmsnorm")
    for name, manifest in (("good", good), ("bad", "this is [not toml")):
        Workload.objects.create(
            org=orgs[0], name=name, manifest=manifest, sha256=sha256_hex(manifest)
        )
    job, results = job_on_the_gpu(orgs[0], customer, candidates=3)
    odd = job.candidates.order_by("pk")
    Candidate.objects.filter(pk=odd[0].pk).update(schedule={"family": "no-such-family", "x": 1})
    Candidate.objects.filter(pk=odd[1].pk).update(schedule={})
    services.results_record(results=results)
    for c, predicted in zip(job.candidates.order_by("pk"), (1.0, 2.0, 3.0), strict=True):
        Candidate.objects.filter(pk=c.pk).update(predicted_us=predicted)
    Workload.objects.update(row_lengths=[])
    Candidate.objects.update(schedule_label="")

    migration.backfill(apps, None)

    assert Workload.objects.get(name="good").row_lengths == [4096, 8192]
    assert Workload.objects.get(name="bad").row_lengths == []
    labels = list(job.candidates.order_by("pk").values_list("schedule_label", flat=True))
    assert labels[0] and labels[1] == derived.HAND_WRITTEN
    assert Job.objects.get(pk=job.pk).model_rho == pytest.approx(1.0)
