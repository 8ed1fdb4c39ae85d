"""Derived facts stored when written (portal/derived.py): a workload's row lengths, a candidate's
schedule label, the cost model's rank correlation per generation and per job. The backfill
computes them for the rows that exist; a row whose data no longer reads keeps the neutral value
([], "", None), as the services would store for it."""

from django.db import migrations, models
from django.db.models import Sum

BATCH = 500


def backfill_workloads(Workload):
    from portal.derived import manifest_row_lengths

    changed = []
    for w in Workload.objects.only("pk", "manifest", "baseline_source", "baseline_filename"):
        w.row_lengths = manifest_row_lengths(
            w.manifest or "", w.baseline_source or "", w.baseline_filename or ""
        )
        if w.row_lengths:
            changed.append(w)
    Workload.objects.bulk_update(changed, ["row_lengths"], batch_size=BATCH)


def backfill_labels(Candidate):
    import json

    from portal.derived import schedule_label

    seen: dict[str, str] = {}
    changed = []
    for c in Candidate.objects.only("pk", "schedule").iterator(chunk_size=BATCH):
        try:
            key = json.dumps(c.schedule, sort_keys=True, default=str)
        except (TypeError, ValueError):
            key = repr(c.schedule)
        if key not in seen:
            seen[key] = schedule_label(c.schedule if isinstance(c.schedule, dict) else None)
        c.schedule_label = seen[key]
        changed.append(c)
        if len(changed) >= BATCH:
            Candidate.objects.bulk_update(changed, ["schedule_label"])
            changed = []
    Candidate.objects.bulk_update(changed, ["schedule_label"])


def backfill_rho(TimingResult, Generation, Job):
    from portal.derived import rank_correlation

    by_job: dict[int, list[tuple[int, float, float]]] = {}
    for r in (
        TimingResult.objects.filter(
            candidate__status="passed", candidate__predicted_us__isnull=False
        )
        .values("candidate_id", "candidate__job_id", "candidate__generation_id")
        .annotate(total=Sum("median_us"), predicted=models.Max("candidate__predicted_us"))
        .order_by()
    ):
        if r["total"] is None:
            continue
        by_job.setdefault(r["candidate__job_id"], []).append(
            (r["candidate__generation_id"], r["predicted"], r["total"])
        )
    for job_id, rows in by_job.items():
        Job.objects.filter(pk=job_id).update(
            model_rho=rank_correlation([(p, m) for _, p, m in rows])
        )
        for gen_id in {g for g, _, _ in rows}:
            pairs = [(p, m) for g, p, m in rows if g == gen_id]
            Generation.objects.filter(pk=gen_id).update(model_rho=rank_correlation(pairs))


def backfill(apps, schema_editor):
    backfill_workloads(apps.get_model("portal", "Workload"))
    backfill_labels(apps.get_model("portal", "Candidate"))
    backfill_rho(
        apps.get_model("portal", "TimingResult"),
        apps.get_model("portal", "Generation"),
        apps.get_model("portal", "Job"),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0003_gpubatch_started"),
    ]

    operations = [
        migrations.AddField(
            model_name="candidate",
            name="schedule_label",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="generation",
            name="model_rho",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="model_rho",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workload",
            name="row_lengths",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
