"""Command line: `python -m gpuworker run BATCH.json -o RESULTS.json`, `python -m gpuworker probe`.

For air-gapped GPU hosts: a batch file in, a results file out, nothing else needed. Exit codes:
`run`: 0 done, 2 the batch or manifest was refused, 3 no usable GPU here. `probe`: 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _cmd_probe(_args) -> int:
    from gpuworker.env import probe

    info = probe()
    if info.get("gpu") is None:
        # Not an error of the command: it answered the question. Scripts read "gpu": null.
        print(info.get("error", "no GPU"))
        print(json.dumps({k: v for k, v in info.items() if k != "error"}, indent=2))
        return 0
    print(json.dumps(info, indent=2))
    return 0


def _cmd_run(args) -> int:
    from gpuworker.batch import BatchError
    from gpuworker.runner import NoGpu, run_batch

    try:
        with open(args.batch, encoding="utf-8") as f:
            batch = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"cannot read batch {args.batch}: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()

    def log(msg):
        if not args.quiet:
            print(f"[{time.monotonic() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    try:
        results = run_batch(batch, log=log)
    except BatchError as e:
        print("batch refused:", file=sys.stderr)
        for field, problem in e.errors:
            print(f"  {field}: {problem}", file=sys.stderr)
        return 2
    except NoGpu as e:
        print(f"no GPU: {e}", file=sys.stderr)
        return 3
    except ValueError as e:  # SpecError is a ValueError with `errors`
        print("manifest refused:", file=sys.stderr)
        for field, problem in getattr(e, "errors", [("manifest", str(e))]):
            print(f"  {field}: {problem}", file=sys.stderr)
        return 2
    text = json.dumps(results, indent=1)
    if args.output == "-":
        print(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    for c in results["candidates"]:
        best = min((t["median_us"] for t in c["timing"]), default=None)
        log(
            f"{c['id']}: {c['status']}"
            + (f" {best:.1f} us" if best else "")
            + (f" ({c['reason'][:120]})" if c["reason"] else "")
        )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuworker", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe", help="print the device and software, or why there is no GPU")
    r = sub.add_parser("run", help="verify and time a batch file")
    r.add_argument("batch")
    r.add_argument("-o", "--output", default="-", help="results file (default: stdout)")
    r.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    return {"probe": _cmd_probe, "run": _cmd_run}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
