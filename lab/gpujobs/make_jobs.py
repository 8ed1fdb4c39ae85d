"""Customers' jobs through the portal's own submission path, up to the GPU stage, exported as
batch files for an air-gapped GPU host (DESIGN.md, "two ways to run").

    .venv/bin/python -m lab.gpujobs.make_jobs [--var var/gpujobs] [--out lab/gpujobs/batches]

A throwaway SQLite database under --var (never the CI database: DATABASE_URL is set to that
file, CELERY_BROKER_URL is cleared); Celery in eager mode, so the upload request itself runs the
CPU stages (agents, nvJitLink builds, review) until the job waits for GPU results; GPU_DISPATCH
off, so the batch waits for a results file. A customer of "Acme Research" logs in through the
login form and uploads each catalogue operator through the upload form (catalogue mode, the
shapes typed as a customer types them); then `manage.py export_batch` writes each job's batch to
OUT/<key>.json, and OUT/jobs.json lists the jobs (key, operator, job and batch codes, family,
shapes, baselines, candidates).

The same --var is what `lab.gpujobs.import_and_shoot` imports the results into later.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VAR = ROOT / "var" / "gpujobs"  # git-ignored (/var/), never copied to the device

# key, catalogue operator, the shapes typed in the form ("" = the catalogue's own), dtype.
# The attention job asks for 16 heads of the 4096-token case (B=1, H=16, S=4096): at the
# catalogue's own shapes (4x32x4096 and 1x32x16384) the worker's float64 reference alone (about
# 2e10 scores over its input sets, one numpy thread each) would take minutes of CPU on the GPU
# host, more than this run's 300 s.
JOBS = (
    ("matmul", "matmul_bias_gelu", "", "bf16"),
    ("attention", "attention_softcap", "B=1 H=16 S=4096", "bf16"),
    ("cumsum", "cumsum_rows", "", "fp32"),
    ("bias_grad", "bias_grad", "", "bf16"),
)
CUSTOMER = ("carol", "carol-gpujobs-pass")
POPULATION = 4  # candidates a generation; the batches must all run in one 300 s device call


def configure(var: Path) -> None:
    """The portal's settings for a throwaway run, set before Django starts."""
    var.mkdir(parents=True, exist_ok=True)
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="portal.settings",
        PTXF_VAR_DIR=str(var),
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        CELERY_TASK_ALWAYS_EAGER="1",
        GPU_DISPATCH="0",
        FACTORY_POPULATION=str(POPULATION),
        ALLOWED_HOSTS="localhost,127.0.0.1,testserver",
    )


def setup_django(var: Path):
    configure(var)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def customer_user():
    """The customer (made once, as an admin would: an organisation and a membership)."""
    from django.contrib.auth import get_user_model

    from portal import services
    from portal.models import Organisation

    users = get_user_model()
    user = users.objects.filter(username=CUSTOMER[0]).first()
    if user is None:
        org = Organisation.objects.filter(name="Acme Research").first()
        org = org or services.organisation_create(name="Acme Research")
        user = users.objects.create_user(username=CUSTOMER[0], password=CUSTOMER[1])
        services.membership_set(user=user, org=org, role="customer")
    return user


def logged_in_client():
    from django.test import Client
    from django.urls import reverse

    customer_user()
    client = Client()
    r = client.post(reverse("login"), {"username": CUSTOMER[0], "password": CUSTOMER[1]})
    if r.status_code != 302:
        raise SystemExit(f"login refused ({r.status_code})")
    return client


def submit(client, operator: str, shapes: str, dtype: str):
    """Upload one catalogue operator through the form; returns the job it redirected to."""
    from django.urls import reverse

    from portal.models import Job

    form = {
        "mode": "catalogue",
        "operator": operator,
        "shapes": shapes,
        "dtype": dtype,
        "target": "sm_90",
        "generations": "1",
    }
    r = client.post(reverse("web-upload"), form)
    if r.status_code != 302 or "/jobs/" not in r.url:
        body = r.content.decode("utf-8", "replace")[:3000]
        raise SystemExit(f"upload of {operator} refused ({r.status_code}):\n{body}")
    code = r.url.rstrip("/").rsplit("/", 1)[-1]
    page = client.get(r.url)
    if page.status_code != 200:
        raise SystemExit(f"the job page of {operator} answered {page.status_code}")
    return Job.objects.get(code=code)


def export(job, path: Path) -> dict:
    from django.core.management import call_command

    from portal.models import Job

    job.refresh_from_db()
    if job.status != Job.WAITING_GPU:
        raise SystemExit(f"job {job.code} is {job.status}, not waiting for GPU results: "
                         f"{job.stop_reason}")  # fmt: skip
    call_command("export_batch", str(job.code), "-o", str(path))
    batch = json.loads(path.read_text())
    return batch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--var", default=str(DEFAULT_VAR), help="the throwaway portal's folder")
    ap.add_argument("--out", default=str(ROOT / "lab" / "gpujobs" / "batches"))
    ap.add_argument("--only", default="", help="comma-separated keys (default: all)")
    args = ap.parse_args(argv)
    setup_django(Path(args.var))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "jobs.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    client = logged_in_client()
    only = {k for k in args.only.split(",") if k}
    for key, operator, shapes, dtype in JOBS:
        if only and key not in only:
            continue
        job = submit(client, operator, shapes, dtype)
        batch = export(job, out / f"{key}.json")
        index[key] = {
            "operator": operator,
            "shapes_typed": shapes or "(the catalogue's own)",
            "dtype": dtype,
            "job": str(job.code),
            "workload": str(job.workload.code),
            "batch": batch["batch_id"],
            "family": batch["family"],
            "shapes": batch["shapes"],
            "heldout_shapes": batch["heldout_shapes"],
            "baselines": batch["baselines"],
            "candidates": [c["id"] for c in batch["candidates"]],
            "options": batch["options"],
        }
        print(
            f"{key:10s} job {job.code} batch {batch['batch_id']} family {batch['family']}: "
            f"{len(batch['candidates'])} candidates, baselines {batch['baselines']}",
            flush=True,
        )
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
