"""Bring the GPU host's results files back into the jobs that `lab.gpujobs.make_jobs` made, with
`manage.py import_results`, check that each job moved to review with its charts, and photograph
each job page in headless Chromium at 1280 px, logged in as the customer.

    .venv/bin/python -m lab.gpujobs.import_and_shoot RESULTS_DIR --shots DIR [--var var/gpujobs]

RESULTS_DIR holds <key>.results.json as lab/gpujobs/run_device.sh wrote them. Writes DIR/<key>-
job-1280.png (and the review page an engineer sees, DIR/<key>-review-1280.png) and
DIR/imported.json: per job its status before and after, the import command's output, the stop
reason, the best candidate and its score, the charts the page carries.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from lab.gpujobs.make_jobs import CUSTOMER, DEFAULT_VAR, ROOT, setup_django

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ENGINEER = ("erin", "erin-gpujobs-pass")


def engineer_user():
    """An engineer of the customer's organisation, to see the review page."""
    from django.contrib.auth import get_user_model

    from portal import services
    from portal.models import Membership

    users = get_user_model()
    user = users.objects.filter(username=ENGINEER[0]).first()
    if user is None:
        org = Membership.objects.get(user__username=CUSTOMER[0]).org
        user = users.objects.create_user(username=ENGINEER[0], password=ENGINEER[1], is_staff=True)
        services.membership_set(user=user, org=org, role="engineer")
    return user


def import_one(key: str, path: Path) -> dict:
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    from portal.models import Job

    index = json.loads((ROOT / "lab" / "gpujobs" / "batches" / "jobs.json").read_text())
    job = Job.objects.get(code=index[key]["job"])
    before = job.status
    out = io.StringIO()
    call_command("import_results", str(path), stdout=out)
    job.refresh_from_db()
    client = Client()
    client.force_login(job.created_by)
    page = client.get(reverse("web-job", args=[job.code]))
    charts = page.context["charts"] if page.status_code == 200 else {}
    best = job.best_candidate
    return {
        "key": key,
        "job": str(job.code),
        "status_before": before,
        "status": job.status,
        "stop_reason": job.stop_reason,
        "import_output": out.getvalue().strip(),
        "page_status": page.status_code,
        "charts": sorted(k for k, v in (charts or {}).items() if v),
        "best_candidate": str(best.code) if best else None,
        "best_score_us": best.score_us if best else None,
        "best_entry": best.entry if best else None,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shoot(keys_codes: list[tuple[str, str]], shots: Path) -> list[str]:
    """Start `manage.py runserver` on this portal's settings (they are in os.environ), log in
    as the customer and then the engineer through the login form, photograph each job page
    (and the review page of each job in review), and stop the server."""
    from playwright.sync_api import sync_playwright

    from portal.models import Job

    in_review = [(k, c) for k, c in keys_codes if Job.objects.get(code=c).status == Job.REVIEW]
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT,
        env=os.environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    taken = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.2)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            for who, (user, password), pages in (
                ("customer", CUSTOMER, [(k, f"/jobs/{c}/", "job") for k, c in keys_codes]),
                ("engineer", ENGINEER, [(k, f"/review/{c}/", "review") for k, c in in_review]),
            ):
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                context.set_default_timeout(30_000)
                page = context.new_page()
                page.goto(f"{base}/accounts/login/")
                page.fill("#id_username", user)
                page.fill("#id_password", password)
                page.click("button[type=submit]")
                page.wait_for_url(f"{base}/")
                for key, url, kind in pages:
                    page.goto(base + url)
                    page.wait_for_load_state("networkidle")
                    page.wait_for_timeout(1500)  # Plotly draws after the load event
                    name = shots / f"{key}-{kind}-1280.png"
                    page.screenshot(path=str(name), full_page=True)
                    taken.append(name.name)
                    print(f"{who}: {url} -> {name}", flush=True)
                context.close()
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
    return taken


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--shots", required=True)
    ap.add_argument("--var", default=str(DEFAULT_VAR))
    ap.add_argument("--no-shots", action="store_true")
    args = ap.parse_args(argv)
    setup_django(Path(args.var))
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's responses then carry their template context
    engineer_user()
    shots = Path(args.shots)
    shots.mkdir(parents=True, exist_ok=True)
    report = []
    for path in sorted(Path(args.results_dir).glob("*.results.json")):
        key = path.name.split(".")[0]
        try:
            report.append(import_one(key, path))
        except Exception as exc:  # noqa: BLE001 - reported, and the other jobs still imported
            report.append({"key": key, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(report[-1]), flush=True)
    (shots / "imported.json").write_text(json.dumps(report, indent=1) + "\n")
    if not args.no_shots:
        # every job of the index in this portal (make_jobs --only makes a portal of some):
        # one without a results file is photographed where it waits
        from portal.models import Job

        index = json.loads((ROOT / "lab" / "gpujobs" / "batches" / "jobs.json").read_text())
        here = [
            (k, i["job"]) for k, i in index.items() if Job.objects.filter(code=i["job"]).exists()
        ]
        shoot(here, shots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
