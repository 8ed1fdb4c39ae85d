"""Run the portal's exported batches (lab/gpujobs/batches) with the GPU worker's own command line,
one after another, each with a time limit, inside one overall budget; then print a table.

    PYTHONPATH=. python3 -m lab.gpujobs.run_batches --out $OUT [--total-s 290] [--only a,b]

Each batch is `python -m gpuworker run BATCH -o $OUT/<key>.results.json`, its log in
$OUT/<key>.log. The worker stays in the caller's process group, so a `timeout` around the whole
script reaches it and its children; when a batch's own limit passes, the worker and every
process it started (found through /proc) are killed before the next batch starts.
The limit of a batch is its cap, cut so that the batches after it that must run still get
their floor; an optional batch (OPTIONAL) runs only if its floor is left. $OUT/runs.json keeps
each batch's exit status (0 ran, 2 refused, 3 no GPU, "timeout") and wall time.

The table: per job and benchmarked shape, each entrant's status and median time, and the ratio
of each passed baseline's median to the fastest passed candidate's (above 1: ours faster).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCHES = ROOT / "lab" / "gpujobs" / "batches"
# key -> (cap_s, floor_s), in the order they run: the dearest first, so it always gets its cap
# (max-autotune compiles the GEMM at each of its 4 shapes, ~10 s each); the limit of each later
# one keeps the floors of those after it, and the optional one runs on what is left.
PLAN = {
    "matmul": (140, 90),
    "attention": (170, 60),
    "cumsum": (70, 45),
    "bias_grad": (70, 40),
}
OPTIONAL = {"bias_grad"}


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces: the fields after it start past the last ")"
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM the worker and everything it started, then SIGKILL what is left."""
    tree = [proc.pid] + _descendants(proc.pid)
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.1)
            proc.poll()
        if not any(_alive(p) for p in tree):
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_RUNNING: list[subprocess.Popen] = []


def _on_signal(signum, _frame):
    """Stopped from outside (a timeout around the script): take the running batch down too."""
    for proc in _RUNNING:
        _kill_tree(proc)
    sys.exit(128 + signum)


def run_one(key: str, out: Path, limit_s: float) -> dict:
    batch = BATCHES / f"{key}.json"
    results = out / f"{key}.results.json"
    cmd = [sys.executable, "-m", "gpuworker", "run", str(batch), "-o", str(results)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    with open(out / f"{key}.log", "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}  (limit {limit_s:.0f} s)\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _RUNNING.append(proc)
        try:
            rc = proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            rc = "timeout"
        finally:
            _RUNNING.remove(proc)
    wall = round(time.monotonic() - t0, 1)
    return {"key": key, "rc": rc, "wall_s": wall, "limit_s": round(limit_s, 1),
            "results": results.name if results.exists() else None}  # fmt: skip


def run_all(out: Path, total_s: float, keys: list[str]) -> list[dict]:
    t0 = time.monotonic()
    runs = []
    for i, key in enumerate(keys):
        cap, floor = PLAN.get(key, (60, 30))
        left = total_s - (time.monotonic() - t0)
        later = sum(PLAN.get(k, (60, 30))[1] for k in keys[i + 1 :] if k not in OPTIONAL)
        limit = min(cap, left - later)
        if limit < floor:
            runs.append({"key": key, "rc": "skipped", "wall_s": 0.0, "limit_s": round(limit, 1),
                         "results": None, "why": f"{left:.0f} s left, {later} s kept for "
                         "the batches after it"})  # fmt: skip
            print(f"{key}: skipped ({runs[-1]['why']})", flush=True)
            continue
        print(f"{key}: running (limit {limit:.0f} s)", flush=True)
        runs.append(run_one(key, out, limit))
        print(f"{key}: exit {runs[-1]['rc']} after {runs[-1]['wall_s']} s", flush=True)
        (out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    return runs


def _dims(d: dict) -> str:
    return "x".join(str(v) for v in d.values())


def table(out: Path, keys: list[str]) -> str:
    lines = []
    for key in keys:
        path = out / f"{key}.results.json"
        if not path.exists():
            lines.append(f"{key}: no results file")
            continue
        r = json.loads(path.read_text())
        env = r.get("env") or {}
        lines.append(f"== {key} ({r.get('family')}) on {env.get('gpu')}, driver "
                     f"{env.get('driver')}, torch {env.get('torch')}, copy ceiling "
                     f"{r.get('copy_ceiling_tbps')} TB/s")  # fmt: skip
        entrants = [(f"ours {c['id'][:8]}", c) for c in r["candidates"]]
        entrants += [(b["name"], b) for b in r["baselines"]]
        shapes = []
        for _, e in entrants:
            for t in e.get("timing") or []:
                if t["dims"] not in shapes:
                    shapes.append(t["dims"])
        for name, e in entrants:
            if e["status"] != "passed":
                lines.append(f"  {name:28s} {e['status']}: {(e.get('reason') or '')[:110]}")
        for dims in shapes:
            med = {}
            for name, e in entrants:
                if e["status"] == "passed":
                    for t in e["timing"]:
                        if t["dims"] == dims:
                            med[name] = t["median_us"]
            ours = {n: m for n, m in med.items() if n.startswith("ours")}
            if not ours:
                continue
            best_name = min(ours, key=ours.get)
            lines.append(f"  {_dims(dims)}: best {best_name} {ours[best_name]:.1f} us")
            for name, m in sorted(med.items(), key=lambda kv: kv[1]):
                ratio = m / ours[best_name]
                lines.append(f"    {name:28s} {m:10.1f} us  {ratio:5.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpujobs_out"))
    ap.add_argument("--total-s", type=float, default=290.0)
    ap.add_argument("--only", default="", help="comma-separated keys (default: every batch)")
    ap.add_argument("--table", action="store_true", help="only print the table of --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keys = [k for k in PLAN if (BATCHES / f"{k}.json").exists()]
    if args.only:
        keys = [k for k in keys if k in args.only.split(",")]
    if not args.table:
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        run_all(out, args.total_s, keys)
    print(table(out, keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
