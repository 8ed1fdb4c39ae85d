"""Portal latency under concurrent clients, through the production server, with 2,000 candidates.

What it does, in one command:

1. makes a fresh database (PostgreSQL by default, `--database-url postgres:///ptxf_bench`, dropped
   and created again; or `sqlite:///path`), migrates it and fills it through the real
   results-recording service with one softmax job of 2,000 candidates over 20 generations (each
   passing candidate verified at 5 shapes and timed at 3 with 100 raw samples, 5 baselines,
   flags) and a few hundred other jobs around it;
2. starts the production web server exactly as `up --production` does (gunicorn with WhiteNoise
   after collectstatic, PRODUCTION=1 and the documented proxy setting TRUST_X_FORWARDED_PROTO=1;
   the clients send `X-Forwarded-Proto: https` as the TLS proxy in front would);
3. drives `--clients` concurrent HTTP clients (8 by default, each with its own keep-alive
   connection) over every GET page and API endpoint, `--requests` times each, in shuffled order,
   after one unmeasured warm-up pass; then approves the job and does the same for the pages of
   an approved job and the artifact downloads;
4. prints p50 / p95 / max per endpoint and writes bench/results/portal_latency-<UTC stamp>.json
   and .md with the date, the machine, the versions and the settings.

    .venv/bin/python -m bench.portal_latency                       # PostgreSQL, 8 clients
    .venv/bin/python -m bench.portal_latency --clients 32
    .venv/bin/python -m bench.portal_latency --database-url sqlite:////tmp/ptxf-bench.sqlite3

Endpoints that change state (submit, stop, cancel, approve, token create/revoke, imports) are
not in the request mix: they would change what the next request measures. The exit status is 0
when every endpoint's p95 is under the target (300 ms), 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
TARGET_P95_MS = 300.0
BASELINES = ["customer", "torch_eager", "torch_compile", "torch_compile_max_autotune", "triton"]
DEFAULT_DATABASE_URL = "postgres:///ptxf_bench"


def never_stop(history, **kwargs) -> str:
    """FACTORY_SHOULD_STOP while filling: the search runs all its generations."""
    return ""


def server_environment(var_dir: Path, database_url: str, secret_key: str) -> dict[str, str]:
    """The environment of the seeding process and of gunicorn alike: the documented production
    settings (docs/DEPLOYMENT.md), this run's database and a throwaway var folder."""
    return {
        "DATABASE_URL": database_url,
        "PRODUCTION": "1",
        "DEBUG": "0",
        "SECRET_KEY": secret_key,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "TRUST_X_FORWARDED_PROTO": "1",
        "PTXF_VAR_DIR": str(var_dir),
        "STATIC_ROOT": str(var_dir / "static"),
        "MEDIA_ROOT": str(var_dir / "media"),
        "GPU_DISPATCH": "0",
        "AXES_ENABLED": "1",
        "FACTORY_SHOULD_STOP": "bench.portal_latency.never_stop",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        # several gunicorn workers share one cache, as docs/DEPLOYMENT.md sets production up
        "CACHE_URL": os.environ.get("PTXF_LATENCY_CACHE_URL", "redis://127.0.0.1:6379/13"),
    }


def fresh_database(database_url: str) -> None:
    """Drop and create the database the URL names (PostgreSQL), or delete the SQLite file."""
    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    if parts.scheme == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(parts.path + suffix).unlink(missing_ok=True)
        return
    if name in ("ptxf", "ptxf_ci", "postgres", "template0", "template1"):
        raise SystemExit(f"refusing to drop the database {name!r}: name one for the benchmark")
    import psycopg
    from psycopg import sql

    conninfo = {
        "dbname": "postgres",
        "user": parts.username or None,
        "password": parts.password or None,
        "host": parts.hostname or None,
        "port": parts.port or None,
    }
    with psycopg.connect(**{k: v for k, v in conninfo.items() if v}, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    # The seeded job's "search is done" email goes nowhere (the console backend would print it).
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)


# --- the data ---------------------------------------------------------------------------------


def _timing(dims, median_us, rng, n_samples=100):
    samples = [median_us * (1 + rng.gauss(0, 0.01)) for _ in range(n_samples)]
    return {
        "dims": dims,
        "median_us": median_us,
        "p20_us": median_us * 0.99,
        "p80_us": median_us * 1.01,
        "ci_low_us": median_us * 0.995,
        "ci_high_us": median_us * 1.005,
        "samples_us": samples,
        "bytes": dims["M"] * dims["N"] * 4,
        "tbps": dims["M"] * dims["N"] * 4 / (median_us * 1e-6) / 1e12,
        "sm_clock_mhz": 1980,
    }


def populate(n_candidates: int, generations: int = 20):
    """The big job, through the real results-recording service (so the rows are exactly what
    production writes), plus background jobs of other organisations."""
    from django.contrib.auth import get_user_model

    from portal import services
    from portal.models import (
        Candidate,
        Generation,
        GpuBatch,
        Job,
        Workload,
        sha256_hex,
    )

    rng = random.Random(7)
    acme = services.organisation_create(name="Acme")
    factory_org = services.organisation_create(name="Factory")
    users = get_user_model().objects
    customer = users.create_user("alice", "alice@acme.example", "pw")
    engineer = users.create_user("erin", "erin@factory.example", "pw")
    services.membership_set(user=customer, org=acme, role="customer")
    services.membership_set(user=engineer, org=factory_org, role="engineer")

    ptx_template = (ROOT / "tests" / "portal" / "conftest.py").read_text()
    base_ptx = ptx_template.split('SIMPLE_PTX = """', 1)[1].split('"""', 1)[0]
    # Real kernels are a few hundred lines: pad with comments so the candidate page renders a
    # realistic listing.
    padding = "".join(f"    // schedule note {i}\n" for i in range(300))

    def new_workload(org, name):
        manifest = f'name = "{name}"\n# {uuid.uuid4()}\n'
        return Workload.objects.create(
            org=org, name=name, manifest=manifest, sha256=sha256_hex(manifest), created_by=customer
        )

    # Background: 300 finished jobs of other organisations and 40 of Acme's.
    for i in range(40):
        org = services.organisation_create(name=f"Org {i}")
        for j in range(8):
            wl = new_workload(org, f"op-{i}-{j}")
            Job.objects.create(workload=wl, status=Job.APPROVED, created_by=customer)
    for j in range(40):
        Job.objects.create(workload=new_workload(acme, f"acme-op-{j}"), status=Job.FAILED)

    # The big job's workload is the real softmax manifest, so pages pay for parsing it.
    from factory.spec import catalogue_manifest, load_manifest

    manifest = catalogue_manifest("softmax")
    spec = load_manifest(manifest)
    shapes = [dict(d) for d in spec.shapes]
    heldout = [dict(d) for d in spec.heldout_shapes]
    workload = Workload.objects.create(
        org=acme,
        name=spec.name,
        manifest=manifest,
        sha256=spec.sha256,
        target_gpu=spec.target,
        family="softmax",
        created_by=customer,
    )
    job = Job.objects.create(
        workload=workload,
        status=Job.WAITING_GPU,
        created_by=customer,
        max_generations=generations,
        population=n_candidates // generations,
    )
    per_gen = n_candidates // generations
    best_so_far = 100.0
    for g in range(generations):
        # generation_finish makes the next generation itself; take it over for the batch.
        gen, _ = Generation.objects.get_or_create(job=job, index=g)
        Generation.objects.filter(pk=gen.pk).update(status=Generation.GPU)
        gen.refresh_from_db()
        cands = []
        for k in range(per_gen):
            ptx = base_ptx.replace("//", f"// g{g} c{k}", 1) + padding
            cands.append(
                Candidate(
                    job=job,
                    generation=gen,
                    ptx=ptx,
                    ptx_sha256=sha256_hex(ptx),
                    status=Candidate.QUEUED,
                    role=rng.choice(["planner", "writer", "tuner"]),
                    backend="offline",
                    entry="copy_k",
                    compile_report={"ok": True, "arch": "sm_90", "registers": 32},
                    note=f"tile {k}",
                    predicted_us=rng.uniform(50.0, 150.0),  # the cost model chart, full size
                )
            )
        cands = Candidate.objects.bulk_create(cands)
        code = uuid.uuid4()
        batch_doc = {
            "format": 1,
            "batch_id": str(code),
            "shapes": shapes,
            "heldout_shapes": heldout,
            "candidates": [{"id": str(c.code)} for c in cands],
        }
        GpuBatch.objects.create(
            code=code, job=job, generation=gen, status=GpuBatch.DISPATCHED, batch=batch_doc
        )
        entries = []
        for c in cands:
            passed = rng.random() < 0.7
            speed = best_so_far * (0.9 + 0.5 * rng.random())
            entries.append(
                {
                    "id": str(c.code),
                    "ptx_sha256": c.ptx_sha256,  # results are matched to the PTX they timed
                    "status": "passed" if passed else "failed",
                    "reason": "" if passed else "wrong at M=1,N=4095",
                    "compile": {"ok": True, "registers": 32},
                    "verification": [
                        {
                            "dims": d,
                            "heldout": h,
                            "passed": passed,
                            "rel_err": 1e-4 if passed else 0.3,
                            "max_abs_err": 1e-3,
                            "reason": "",
                        }
                        for h, rows in ((False, shapes), (True, heldout))
                        for d in rows
                    ],
                    "timing": [_timing(d, speed, rng) for d in shapes] if passed else [],
                    "flags": ["above_copy_ceiling: 4.5 TB/s"] if rng.random() < 0.02 else [],
                }
            )
        best_so_far *= 0.93
        results = {
            "format": 1,
            "batch_id": str(code),
            "env": {"gpu": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04"},
            "copy_ceiling_tbps": 4.28,
            "candidates": entries,
            "baselines": [
                {
                    "name": name,
                    "version": "2.11.0",
                    "config": {},
                    "status": "passed",
                    "reason": "",
                    "verification": [],
                    "timing": [_timing(d, 150.0 + 10 * i, rng) for d in shapes],
                }
                for i, name in enumerate(BASELINES)
            ],
        }
        services.results_record(results=results, source="import")
        Job.objects.filter(pk=job.pk).update(status=Job.WAITING_GPU)
        services.generation_finish(generation=Generation.objects.get(pk=gen.pk))
        job.refresh_from_db()
    assert job.status == Job.REVIEW, job.status
    return customer, engineer, job


def analyze(connection) -> bool:
    """Gather the planner's statistics after the fill (PostgreSQL), as autovacuum does on a
    production server a minute after a bulk load: without them the planner takes a table of
    2,000 candidates for an empty one (and a server with autovacuum off never gathers them).
    True when it ran."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return True


# --- the server and the clients -----------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen:
    """gunicorn as `up --production` starts it (portal.management.commands.up.web_server_argv)."""
    from portal.management.commands.up import web_server_argv

    argv = web_server_argv(f"127.0.0.1:{port}", production=True)
    argv = [a if a != "-" else str(log_path) for a in argv]  # the access log to a file
    log = log_path.with_suffix(".err").open("w")
    proc = subprocess.Popen(
        argv, cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=log, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gunicorn exited with {proc.returncode}: see {log.name}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health/", headers={"X-Forwarded-Proto": "https"})
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.3)
    stop_server(proc)
    raise SystemExit("gunicorn did not answer /health/ within 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def server_cpu_s(server_pid: int, database: str) -> float:
    """CPU seconds used so far by the web server's processes (the session gunicorn leads: its
    workers, and through the master's child times any worker that exited) and by the live
    PostgreSQL backends connected to `database` ("" for SQLite). Read from /proc (Linux); the
    difference over a phase is what serving it cost, however loaded the machine was."""
    total_ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()  # fields[0] is the state (the 3rd field)
            session, utime, stime = int(fields[3]), int(fields[11]), int(fields[12])
            if session == server_pid:
                total_ticks += utime + stime
                if int(entry) == server_pid:  # workers reaped by the master
                    total_ticks += int(fields[13]) + int(fields[14])
            elif database:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                if cmdline.startswith(b"postgres: ") and f" {database} ".encode() in cmdline:
                    total_ticks += utime + stime
        except (OSError, ValueError, IndexError):
            continue  # a process that exited while we read
    return total_ticks / os.sysconf("SC_CLK_TCK")


class Endpoint:
    def __init__(self, name: str, path: str, headers: dict[str, str], expect=(200,)):
        self.name, self.path, self.headers, self.expect = name, path, headers, expect
        self.times_ms: list[float] = []
        self.statuses: dict[int, int] = {}


def drive(port: int, endpoints: list[Endpoint], *, clients: int, requests: int, record: bool):
    """`clients` threads, each on its own keep-alive connection, take (endpoint) jobs from one
    shuffled queue holding every endpoint `requests` times, and time each request from sending
    it to the last byte of the answer. Returns the wall time and the failures."""
    work: queue.Queue = queue.Queue()
    order = [e for e in endpoints for _ in range(requests)]
    random.Random(11).shuffle(order)
    for e in order:
        work.put(e)
    failures: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            try:
                e = work.get_nowait()
            except queue.Empty:
                break
            start = time.perf_counter()
            try:
                conn.request("GET", e.path, headers=e.headers)
                response = conn.getresponse()
                response.read()
                status = response.status
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                with lock:
                    failures.append(f"{e.name}: {type(exc).__name__}: {exc}")
                continue
            elapsed = (time.perf_counter() - start) * 1000
            with lock:
                if status not in e.expect:
                    failures.append(f"{e.name}: {e.path} answered {status}")
                if record:
                    e.times_ms.append(elapsed)
                    e.statuses[status] = e.statuses.get(status, 0) + 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, failures


def percentile(sorted_ms: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..1) of a sorted list."""
    if not sorted_ms:
        return float("nan")
    rank = max(1, -(-len(sorted_ms) * q // 1))
    return sorted_ms[int(rank) - 1]


def summarise(e: Endpoint) -> dict:
    times = sorted(e.times_ms)
    return {
        "endpoint": e.name,
        "path": e.path,
        "n": len(times),
        "statuses": {str(k): v for k, v in sorted(e.statuses.items())},
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(percentile(times, 0.95), 1),
        "max_ms": round(times[-1], 1),
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("django", "gunicorn", "whitenoise", "psycopg"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
        else:
            cursor.execute("SELECT sqlite_version()")
        out[connection.vendor] = cursor.fetchone()[0]
    return out


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--candidates", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40, help="measured requests per endpoint")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)

    load_at_start = round(os.getloadavg()[0], 2)  # before this run adds its own load
    var_dir = Path(tempfile.mkdtemp(prefix="ptxf-latency-"))
    env = server_environment(var_dir, args.database_url, secrets.token_urlsafe(48))
    fresh_database(args.database_url)
    setup_django(env)
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from portal import services
    from portal.delivery import decide_and_deliver
    from portal.models import Candidate, TimingResult, VerificationResult

    t0 = time.perf_counter()
    customer, engineer, job = populate(args.candidates)
    fill_s = time.perf_counter() - t0
    analyzed = analyze(connection)
    counts = {
        "candidates": Candidate.objects.filter(job=job).count(),
        "verification_rows": VerificationResult.objects.count(),
        "timing_rows": TimingResult.objects.count(),
    }
    print(f"filled in {fill_s:.1f} s: {counts}", flush=True)
    best = job.best_candidate
    # some candidate far down the list (with fewer candidates, the last but one)
    other = (
        Candidate.objects.filter(job=job)
        .exclude(pk=best.pk)
        .order_by("pk")[min(777, counts["candidates"] - 2)]
    )
    key, _ = services.api_token_create(user=customer, name="bench")

    def session_headers(user) -> dict[str, str]:
        client = Client()
        client.force_login(user)  # a session row in the database the server reads
        cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
        return {"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}", **proxy}

    proxy = {"X-Forwarded-Proto": "https", "Host": "127.0.0.1"}
    as_customer = session_headers(customer)
    as_engineer = session_headers(engineer)
    api = {"Authorization": f"Bearer {key}", **proxy}
    anonymous = dict(proxy)
    j, w = job.code, job.workload.code
    endpoints = [
        Endpoint("login", reverse("login"), anonymous),
        Endpoint("health", reverse("web-health"), anonymous),
        Endpoint("home (customer)", reverse("web-home"), as_customer),
        Endpoint("home (engineer)", reverse("web-home"), as_engineer),
        Endpoint("upload", reverse("web-upload"), as_customer),
        Endpoint("workload", reverse("web-workload", args=[w]), as_customer),
        Endpoint("job", reverse("web-job", args=[j]), as_customer),
        Endpoint("job, page 40", reverse("web-job", args=[j]) + "?page=40", as_customer),
        Endpoint("job progress", reverse("web-job-progress", args=[j]), as_customer, (200, 286)),
        Endpoint("job charts", reverse("web-job-charts", args=[j]), as_customer),
        Endpoint("job candidates", reverse("web-job-candidates", args=[j]), as_customer),
        Endpoint("job results.csv", reverse("web-job-results-csv", args=[j]), as_customer),
        Endpoint("candidate (best)", reverse("web-candidate", args=[best.code]), as_engineer),
        Endpoint("candidate (other)", reverse("web-candidate", args=[other.code]), as_customer),
        Endpoint("review queue", reverse("web-review-queue"), as_engineer),
        Endpoint("review", reverse("web-review", args=[j]), as_engineer),
        Endpoint("evidence", reverse("web-evidence"), as_engineer),
        Endpoint("evidence, softmax", reverse("web-evidence") + "?family=softmax", as_engineer),
        Endpoint("tokens", reverse("web-tokens"), as_customer),
        Endpoint("account", reverse("web-profile"), as_customer),
        Endpoint("help", reverse("web-help"), as_customer),
        Endpoint("help, examples", reverse("web-help-examples"), as_customer),
        Endpoint("api root", reverse("api-root"), api),
        Endpoint("api jobs", reverse("api-jobs"), api),
        Endpoint("api job", reverse("api-job", args=[j]), api),
        Endpoint("api results", reverse("api-results", args=[j]), api),
        Endpoint("api workload", reverse("api-workload", args=[w]), api),
        Endpoint("api candidate", reverse("api-candidate", args=[best.code]), api),
    ]
    # whose PostgreSQL backends count as serving this run (server_cpu_s)
    database_name = (
        urlsplit(args.database_url).path.lstrip("/") if connection.vendor == "postgresql" else ""
    )
    port = free_port()
    log_path = var_dir / "gunicorn-access.log"
    server = start_server(env, port, log_path)
    try:
        phases = []
        for phase, batch in (("searching", endpoints), ("approved", None)):
            if batch is None:
                decide_and_deliver(
                    job=job, reviewer=engineer, decision="approve", comment="bench", checklist={}
                )
                batch = [
                    Endpoint("job (approved)", reverse("web-job", args=[j]), as_customer),
                    Endpoint(
                        "artifact download",
                        reverse("web-artifact-download", args=[j]),
                        as_customer,
                    ),
                    Endpoint("api job (approved)", reverse("api-job", args=[j]), api),
                    Endpoint("api artifact", reverse("api-artifact", args=[j]), api),
                ]
            _, failures = drive(port, batch, clients=args.clients, requests=2, record=False)
            if failures:
                raise SystemExit("warm-up failed:\n  " + "\n  ".join(failures[:20]))
            cpu_before = server_cpu_s(server.pid, database_name)
            wall_s, failures = drive(
                port, batch, clients=args.clients, requests=args.requests, record=True
            )
            cpu_s = server_cpu_s(server.pid, database_name) - cpu_before
            if failures:
                raise SystemExit("requests failed:\n  " + "\n  ".join(failures[:20]))
            n = sum(len(e.times_ms) for e in batch)
            print(
                f"{phase}: {n} requests in {wall_s:.1f} s ({n / wall_s:.0f}/s), server CPU "
                f"{cpu_s * 1000 / n:.1f} ms a request",
                flush=True,
            )
            phases.append(
                {
                    "phase": phase,
                    "requests": n,
                    "wall_s": round(wall_s, 2),
                    "server_cpu_s": round(cpu_s, 2),
                    "server_cpu_ms_per_request": round(cpu_s * 1000 / n, 1),
                }
            )
            for e in batch:
                row = summarise(e)
                print(
                    f"  {row['endpoint']:<22} p50 {row['p50_ms']:7.1f}  p95 {row['p95_ms']:7.1f}"
                    f"  max {row['max_ms']:7.1f} ms",
                    flush=True,
                )
        rows = [summarise(e) for e in endpoints + batch]
        server_argv = server.args
    finally:
        stop_server(server)

    worst = max(rows, key=lambda r: r["p95_ms"])
    from portal.management.commands.up import web_server_argv

    report = {
        "benchmark": "portal_latency",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": connection.vendor,
        "server": " ".join(Path(a).name if i == 0 else a for i, a in enumerate(server_argv)),
        "web_server_argv_of_up": web_server_argv("ADDR", production=True)[1:],
        "clients": args.clients,
        "requests_per_endpoint": args.requests,
        "machine": {
            **machine(),
            "loadavg_1m_at_start": load_at_start,
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "versions": versions(),
        "git_commit": _git_commit(),
        "data": counts,
        "fill_s": round(fill_s, 1),
        "analyzed_after_fill": analyzed,
        "phases": phases,
        "target_p95_ms": TARGET_P95_MS,
        "all_under_target": worst["p95_ms"] < TARGET_P95_MS,
        "worst": {"endpoint": worst["endpoint"], "p95_ms": worst["p95_ms"]},
        "endpoints": rows,
    }
    shutil.rmtree(var_dir, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M")
    json_path = out / f"portal_latency-{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    json_path.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {json_path} and .md")
    return 0 if report["all_under_target"] else 1


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""


def markdown(report: dict) -> str:
    m, v = report["machine"], report["versions"]
    worst = report["worst"]
    lines = [
        f"# Portal latency, {report['date']}",
        "",
        f"{report['database']} ({v.get(report['database'])}), {report['data']['candidates']} "
        f"candidates in one job, {report['clients']} concurrent clients, "
        f"{report['requests_per_endpoint']} measured requests per endpoint through "
        f"`{report['server']}` (as `up --production` starts it, PRODUCTION=1).",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB ({m['platform']}); "
        f"1-minute load average {m.get('loadavg_1m_at_start', '?')} before the run, "
        f"{m['loadavg_1m_at_end']} at the end (the clients run on the same machine). "
        f"Python {v['python']}, Django {v['django']}, gunicorn {v['gunicorn']}, "
        f"WhiteNoise {v['whitenoise']}, psycopg {v['psycopg']}; commit {report['git_commit']}."
        + (" ANALYZE ran after the fill." if report.get("analyzed_after_fill") else ""),
        "",
        "| endpoint | p50 ms | p95 ms | max ms |",
        "|---|---|---|---|",
        *(
            f"| {r['endpoint']} | {r['p50_ms']} | {r['p95_ms']} | {r['max_ms']} |"
            for r in report["endpoints"]
        ),
        "",
        *(
            f"Phase {p['phase']}: {p['requests']} requests in {p['wall_s']} s; the server "
            f"(gunicorn and its PostgreSQL backends) used {p.get('server_cpu_s', '?')} CPU-s, "
            f"{p.get('server_cpu_ms_per_request', '?')} ms a request."
            for p in report.get("phases", [])
        ),
        "",
        f"Target p95 < {report['target_p95_ms']:.0f} ms: "
        f"{'met by every endpoint' if report['all_under_target'] else 'NOT met'} "
        f"(worst: {worst['endpoint']}, {worst['p95_ms']} ms).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
