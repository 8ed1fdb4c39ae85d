"""On a GPU host: the portal as a user runs it, followed from submission to results.

`manage.py up` with the embedded defaults (SQLite and the filesystem broker under a fresh
PTXF_VAR_DIR; a CPU worker for agents/build and one GPU worker per visible GPU, as
start_workers plans them), a customer's manifest submitted through the API, and each job
followed to its end: every few seconds the API's job (status, stage, GPU queue) and the job
page's progress fragment as the customer sees it (logged in through the login form). At the end
the jobs' results from the API. Nothing is faked: the kernels the job reports were built by the
CPU worker, judged and timed by the Celery GPU worker.

    PYTHONPATH=. python3 -m lab.probes.portal_gpu --out $OUT/portal --catalogue rmsnorm \
        --generations 2 --per-row-length --deadline-s 360

Writes timeline.jsonl (one line per change seen), results.json (each job's API results),
report.md (the timeline and each job's best candidate) and up.log (the portal's own output).
"""

from __future__ import annotations

import argparse
import html
import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ("demo", "demo-pass-2026")


def log(msg: str) -> None:
    print(f"[portal_gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def text_of(fragment: str) -> str:
    """An HTML fragment as the words a reader sees (scripts and tags dropped)."""
    fragment = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", fragment)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def queue_line(fragment: str) -> str:
    """The GPU queue's sentences of the progress fragment."""
    found = re.search(r"GPU queue (.*?)(?: Generations #|$)", fragment)
    return found.group(1)[:240] if found else "-"


class Portal:
    """HTTP to the running portal: the API with a bearer token, pages with a login session."""

    def __init__(self, base: str):
        if not base.startswith("http://"):
            raise ValueError(f"the portal's address must be http://host:port, not {base!r}")
        self.base = base.rstrip("/")  # http only (checked): the opens below are S310-safe
        self.token = ""
        self.web = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)  # noqa: S310
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def login(self, username: str, password: str) -> None:
        page = self.web.open(self.base + "/accounts/login/", timeout=30).read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if csrf is None:
            raise RuntimeError("the login page has no CSRF token")
        form = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": csrf.group(1)}
        ).encode()
        url = self.base + "/accounts/login/"
        req = urllib.request.Request(url, data=form, method="POST")  # noqa: S310
        req.add_header("Referer", self.base + "/accounts/login/")
        landed = self.web.open(req, timeout=30)
        if "/accounts/login/" in landed.geturl():
            raise RuntimeError("the login form refused the demo account")

    def page(self, path: str) -> str:
        return self.web.open(self.base + path, timeout=30).read().decode()


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if needle in path.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(1.0)
    return False


def with_shapes(manifest: str, shapes: str) -> str:
    """The catalogue manifest (its [[shapes]] tables last) with other shapes, rows by row
    length under the operator's own dim names: "16384x5000,1x4999" (cross-entropy's 4096x50257
    is M = 4096, V = 50257)."""
    from factory.families.row.ir import lower
    from factory.spec import load_manifest

    ir = lower(load_manifest(manifest))
    (batch,) = ir.batch_dims
    head = manifest[: manifest.index("[[shapes]]")]
    for shape in shapes.split(","):
        m, n = (int(x) for x in shape.lower().split("x"))
        head += f"[[shapes]]\n{batch} = {m}\n{ir.row_dim} = {n}\n\n"
    return head


def make_token(var_dir: str) -> str:
    """An API key for the demo customer, made in the portal's own database."""
    code = (
        "from django.contrib.auth import get_user_model\n"
        "from portal import services\n"
        "key, _ = services.api_token_create(user=get_user_model().objects.get(username='demo'),"
        " name='portal_gpu')\n"
        "print('KEY', key)\n"
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env={**os.environ, "PTXF_VAR_DIR": var_dir},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return re.search(r"^KEY (\S+)$", out.stdout, re.M).group(1)


def follow(portal: Portal, codes: list[str], deadline: float, timeline: Path) -> dict[str, dict]:
    """Poll each job until none is active or the deadline passes; one timeline line per change."""
    last: dict[str, tuple] = {}
    final: dict[str, dict] = {}
    t0 = time.monotonic()
    with timeline.open("w") as fh:
        while True:
            active = 0
            for code in codes:
                status, job = portal.api("GET", f"/api/v1/jobs/{code}/")
                if status != 200:
                    log(f"job {code}: API answered {status}: {job}")
                    continue
                final[code] = job
                active += not job["done"]
                fragment = text_of(portal.page(f"/jobs/{code}/progress/"))
                key = (
                    job["status"],
                    job["stage"],
                    job["generations_done"],
                    json.dumps(job["gpu_queue"], sort_keys=True),
                    re.sub(r"\d+(\.\d+)? ?(s|min|h)\b", "", fragment),  # not the clocks alone
                )
                if key != last.get(code):
                    last[code] = key
                    row = {
                        "t_s": round(time.monotonic() - t0, 1),
                        "job": code,
                        "status": job["status"],
                        "stage": job["stage"],
                        "generations_done": job["generations_done"],
                        "candidates": job["candidates"],
                        "gpu_queue": job["gpu_queue"],
                        "best_score_us": job["best_score_us"],
                        "page": fragment,
                    }
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    log(
                        f"{code[:8]} {job['status']}/{job['stage']} gen {job['generations_done']}"
                        f" best {job['best_score_us']} | {queue_line(fragment)}"
                    )
            if not active or time.monotonic() > deadline:
                return final
            time.sleep(3.0)


def report(out: Path, final: dict, results: dict, timeline: Path, facts: dict) -> None:
    lines = ["# The portal on a GPU host, submission to results", ""]
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    lines += ["", "## Timeline (API status/stage, and the job page's progress as shown)", ""]
    lines += ["| t (s) | job | status / stage | gen | page |", "|---|---|---|---|---|"]
    for raw in timeline.read_text().splitlines():
        r = json.loads(raw)
        page = r["page"][:220].replace("|", "/")
        lines.append(
            f"| {r['t_s']} | {r['job'][:8]} | {r['status']} / {r['stage']} "
            f"| {r['generations_done']} | {page} |"
        )
    lines += ["", "## Jobs", ""]
    for code, job in final.items():
        lines.append(
            f"- {code[:8]} {job['name']}: {job['status']}, {job['generations_done']} of "
            f"{job['max_generations']} generations, candidates {job['candidates']}, best "
            f"{job['best_score_us']} us; stop: {job['stop_reason'] or '-'}"
        )
        res = results.get(code) or {}
        best = res.get("best") or {}
        checks = best.get("verification", [])
        lines.append(
            f"  - best {best.get('entry', '-')}: {sum(v['passed'] for v in checks)} of "
            f"{len(checks)} checks passed ({sum(v['heldout'] for v in checks)} held out); "
            f"copy ceiling {res.get('copy_ceiling_tbps')} TB/s; compared with "
            f"{best.get('compared_with')}: speedups {best.get('speedups')}"
        )
        for t in best.get("timing", []):
            lines.append(
                f"  - ours {t['dims']}: median {t['median_us']} us (p20 {t['p20_us']}, p80 "
                f"{t['p80_us']}), {t['tbps']} TB/s"
            )
        for b in res.get("baselines", []):
            for t in b["timing"]:
                lines.append(
                    f"  - {b['name']} {t['dims']}: median {t['median_us']} us, {t['tbps']} TB/s"
                )
        for c in res.get("candidate_results", []):
            time_or_reason = (
                f"{c['score_us']:.1f} us" if c["score_us"] is not None else (c["reason"] or "")
            )
            lines.append(
                f"  - gen {c['generation']} {c['entry']}: {c['status']}"
                f"{', ' + time_or_reason[:160] if time_or_reason else ''}"
            )
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--catalogue", default="rmsnorm", help="a catalogue manifest's name")
    ap.add_argument(
        "--shapes", default="", help="MxN,... in place of the manifest's shapes (e.g. 16384x5000)"
    )
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--per-row-length", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=360.0)
    ap.add_argument("--addr", default="127.0.0.1:8765")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    var_dir = tempfile.mkdtemp(prefix="ptxf-var-")
    env = {**os.environ, "PTXF_VAR_DIR": var_dir}
    env.pop("CELERY_BROKER_URL", None)
    env.pop("DATABASE_URL", None)
    os.environ.update({"PTXF_VAR_DIR": var_dir})
    uplog = args.out / "up.log"
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--addr", args.addr],
        cwd=ROOT,
        env=env,
        stdout=uplog.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    t_start = time.monotonic()
    try:
        if not wait_for_line(uplog, "is up", up, 240):
            log("the portal did not come up; see up.log")
            return 1
        up_s = time.monotonic() - t_start
        log(f"up after {up_s:.0f} s")
        portal = Portal(f"http://{args.addr}")
        portal.token = make_token(var_dir)
        portal.login(*DEMO)
        manifest = (ROOT / "factory" / "catalogue" / f"{args.catalogue}.toml").read_text()
        if args.shapes:
            manifest = with_shapes(manifest, args.shapes)
        status, body = portal.api(
            "POST",
            "/api/v1/jobs/",
            {
                "manifest": manifest,
                "generations": args.generations,
                "per_row_length": args.per_row_length,
            },
        )
        if status != 201:
            log(f"the submission was refused ({status}): {body}")
            return 1
        codes = [j["job"] for j in body.get("jobs", [body])]
        log(f"submitted {len(codes)} job(s): {', '.join(c[:8] for c in codes)}")
        timeline = args.out / "timeline.jsonl"
        final = follow(portal, codes, time.monotonic() + args.deadline_s, timeline)
        results = {}
        for code in codes:
            status, body = portal.api("GET", f"/api/v1/jobs/{code}/results/")
            results[code] = body if status == 200 else {"error": status, "body": body}
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        facts = {
            "catalogue": args.catalogue,
            "shapes": args.shapes or "the manifest's",
            "per_row_length": args.per_row_length,
            "generations": args.generations,
            "portal up after (s)": round(up_s, 1),
            "submission to the end (s)": round(time.monotonic() - t_start - up_s, 1),
            "python": sys.version.split()[0],
        }
        report(args.out, final, results, timeline, facts)
        done = sum(j["done"] for j in final.values())
        log(f"{done} of {len(codes)} job(s) ended; report.md written")
        return 0 if done == len(codes) else 2
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
