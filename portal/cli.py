"""`ptxf`: a small command-line client for the JSON API, using only the standard library.

    export PTXF_URL=https://factory.example.com/api/v1/   (or the portal's root URL)
    export PTXF_TOKEN=ptxf_...
    ptxf submit manifest.toml [--baseline kernel.ptx] [--generations 4] [--per-row-length] [--wait]
    ptxf status JOB
    ptxf results JOB [--candidates]
    ptxf download JOB -o kernel.zip
    ptxf jobs [--archived | --all] [--status S] [WORDS]
    ptxf archive JOB  /  ptxf unarchive JOB
    ptxf invite EMAIL [--role customer|admin|engineer] [--org ORG]   (admins and engineers)
    ptxf invitations [--org ORG]  /  ptxf withdraw-invitation INVITATION
    ptxf import model.py:rmsnorm --example-shapes "x=16384x4096:bf16,w=4096:bf16" -o rmsnorm.toml

`ptxf import` runs on your machine only: it loads your Python file, traces the function with
torch.export and writes a manifest (no server, no token). From Python: `from_torch` here, or
`factory.torchimport.from_torch`.

Exit codes: 0 done, 1 refused by the server or (import) not translatable (the message is
printed), 2 bad usage or configuration, 3 the server could not be reached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

USER_AGENT = "ptxf/1"
TIMEOUT_S = 60


class CliError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def api_base(url: str) -> str:
    """Accept the portal root or the API root; return the API root with a trailing slash."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"PTXF_URL must start with http:// or https://, not {url!r}", 2)
    if not url.endswith("/api/v1"):
        url = url + ("/v1" if url.endswith("/api") else "/api/v1")
    return url + "/"


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect, but never carry the token to another origin (scheme, host or port):
    urllib copies every header onto the redirected request, Authorization included."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(new.full_url) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_SameOriginRedirects)


class Client:
    def __init__(self, url: str, token: str):
        if not token:
            raise CliError(
                "set PTXF_TOKEN to an API token (create one on the portal's Tokens page)", 2
            )
        self.base = api_base(url)
        self.token = token

    def _request(self, method: str, path: str, body: dict | None = None):
        data = None
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        url = urllib.parse.urljoin(self.base, path)  # api_base() allowed http(s) only
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
        try:
            return _OPENER.open(request, timeout=TIMEOUT_S)  # http(s) only, token stays home
        except urllib.error.HTTPError as exc:
            raise CliError(_describe_error(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise CliError(f"cannot reach {self.base}: {getattr(exc, 'reason', exc)}", 3) from None

    def json(self, method: str, path: str, body: dict | None = None) -> dict:
        with self._request(method, path, body) as response:
            return json.loads(response.read().decode())

    def download(self, path: str, out: Path) -> tuple[int, str, str | None]:
        """Stream to `out` (through a temporary file, so a broken download leaves nothing);
        returns (bytes, sha256, the server's sha256)."""
        digest = hashlib.sha256()
        size = 0
        tmp = out.with_name(out.name + ".part")
        with self._request("GET", path) as response, open(tmp, "wb") as fh:
            expected = response.headers.get("X-Content-SHA256")
            while chunk := response.read(1 << 16):
                fh.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        if expected and expected != digest.hexdigest():
            tmp.unlink(missing_ok=True)
            raise CliError(f"checksum mismatch: got {digest.hexdigest()}, expected {expected}")
        tmp.replace(out)
        return size, digest.hexdigest(), expected


def _describe_error(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read().decode())
    except (ValueError, UnicodeDecodeError):
        return f"HTTP {exc.code}: {exc.reason}"
    lines = [f"HTTP {exc.code}: {body.get('error', exc.reason)}"]
    for field, problem in body.get("errors", []):
        lines.append(f"  {field}: {problem}" if field else f"  {problem}")
    return "\n".join(lines)


def _code_path(kind: str, code: str) -> str:
    code = code.strip()
    if not code or "/" in code or not all(c.isalnum() or c == "-" for c in code):
        raise CliError(f"{code!r} is not a {kind[:-1]} id", 2)
    return f"{kind}/{code}/"


def _job_path(job: str) -> str:
    return _code_path("jobs", job)


def _print_status(info: dict, out) -> None:
    bar_width = 30
    filled = int(round(info.get("progress", 0) * bar_width))
    print(f"job       {info['job']}  ({info['name']})", file=out)
    if info.get("workload"):
        print(f"workload  {info['workload']}", file=out)
    print(
        f"status    {info['status']}{' / ' + info['stage'] if info.get('stage') else ''}", file=out
    )
    print(
        f"progress  [{'#' * filled}{'.' * (bar_width - filled)}] "
        f"{info.get('generations_done', 0)}/{info.get('max_generations', '?')} generations",
        file=out,
    )
    if info.get("eta_s") is not None and not info.get("done"):
        print(f"eta       about {int(info['eta_s'])} s", file=out)
    counts = info.get("candidates") or {}
    if counts:
        print(
            f"candidates {counts.get('total', 0)} ({counts.get('passed', 0)} verified, "
            f"{counts.get('failed', 0)} failed, {counts.get('rejected', 0)} refused)",
            file=out,
        )
    queue = info.get("gpu_queue") or {}
    if not info.get("done") and info.get("status") == "waiting_gpu" and queue:
        if queue.get("mine_running"):
            where = "on a GPU now"
        elif queue.get("mine_failed"):
            where = "the GPU worker stopped without results; an engineer sends it again"
        elif queue.get("position"):
            where = f"number {queue['position']} in line"
        elif not queue.get("dispatch"):
            where = "waiting for a results file from an air-gapped GPU host"
        else:
            where = "waiting for a GPU worker"
        idle = ""
        if queue.get("idle") and queue.get("dispatch", True):
            when = "lately" if queue.get("last_taken") else "yet"
            idle = f"; no GPU worker has taken a batch from this queue {when}"
        print(f"gpu       gpu.{queue.get('arch', '?')}: {where}{idle}", file=out)
    if info.get("best_score_us"):
        print(f"best      {info['best_score_us']:.3f} us", file=out)
    if info.get("stop_reason"):
        print(f"stopped   {info['stop_reason']}", file=out)
    if info.get("decision"):
        d = info["decision"]
        print(f"decision  {d['decision']}: {d.get('comment') or ''}".rstrip(), file=out)


def cmd_submit(client: Client, args, out) -> int:
    path = Path(args.manifest)
    try:
        manifest = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {exc}", 2) from None
    body: dict = {"manifest": manifest}
    if args.baseline:
        bpath = Path(args.baseline)
        try:
            body["baseline_source"] = bpath.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {bpath}: {exc}", 2) from None
        body["baseline_filename"] = bpath.name
    if args.generations:
        body["generations"] = args.generations
    if args.per_row_length:
        body["per_row_length"] = True
    info = client.json("POST", "jobs/", body)
    jobs = [j["job"] for j in info["jobs"]] if "jobs" in info else [info["job"]]
    for job in jobs:
        print(job, file=out)
    if args.wait:
        return max(_wait(client, job, out) for job in jobs)
    return 0


def _wait(client: Client, job: str, out, poll_s: float = 5.0) -> int:
    while True:
        info = client.json("GET", _job_path(job))
        if info.get("done") or info["status"] == "review":
            _print_status(info, out)
            return 0 if info["status"] in ("review", "approved") else 1
        time.sleep(poll_s)


def cmd_status(client: Client, args, out) -> int:
    info = client.json("GET", _job_path(args.job))
    if args.json:
        json.dump(info, out, indent=2)
        print(file=out)
    else:
        _print_status(info, out)
    return 0


def cmd_results(client: Client, args, out) -> int:
    info = client.json("GET", _job_path(args.job) + "results/")
    if args.json:
        json.dump(info, out, indent=2)
        print(file=out)
        return 0
    _print_status(info, out)
    if args.candidates:
        _print_candidates(info.get("candidate_results", []), out)
    best = info.get("best")
    if not best:
        print("no timed candidate yet", file=out)
        return 0
    print(f"\nbest candidate {best['candidate']}  entry {best['entry']}", file=out)
    for v in best["verification"]:
        dims = " ".join(f"{k}={n}" for k, n in v["dims"].items())
        kind = "held-out" if v["heldout"] else "bench"
        print(
            f"  verify  {dims:<24} {kind:<8} {'ok' if v['passed'] else 'FAIL'}  "
            f"rel_err {v['rel_err'] if v['rel_err'] is not None else float('nan'):.2e}",
            file=out,
        )
    if best.get("compared_with"):
        print(f"  against {best['compared_with']}:", file=out)
    for s in best.get("speedups", []):
        if s.get("missing"):
            print(f"  {s['shape']:<24} not measured", file=out)
            continue
        interval = f"[{s['low']:.2f}, {s['high']:.2f}]" if s.get("low") else ""
        print(
            f"  {s['shape']:<24} {s['baseline_us']:9.2f} us -> {s['candidate_us']:9.2f} us  "
            f"{s['speedup']:.2f}x {interval}",
            file=out,
        )
    for flag in best.get("flags", []):
        print(f"  flag: {flag}", file=out)
    return 0


def _print_candidates(rows: list[dict], out) -> None:
    """Every candidate: its generation, entry, status, and its time or why it was refused."""
    print(f"\ncandidates ({len(rows)})", file=out)
    for c in rows:
        detail = f"{c['score_us']:9.2f} us" if c.get("score_us") is not None else c.get("reason")
        print(
            f"  gen {c['generation']:<3} {c['entry']:<40} {c['status']:<9} {detail or ''}",
            file=out,
        )


def cmd_cancel(client: Client, args, out) -> int:
    _print_status(client.json("POST", _job_path(args.job) + "cancel/"), out)
    return 0


def cmd_stop(client: Client, args, out) -> int:
    _print_status(client.json("POST", _job_path(args.job) + "stop/"), out)
    return 0


def cmd_rerun(client: Client, args, out) -> int:
    body = {"generations": args.generations} if args.generations else None
    info = client.json("POST", _code_path("workloads", args.workload) + "jobs/", body)
    print(info["job"], file=out)
    return _wait(client, info["job"], out) if args.wait else 0


def cmd_download(client: Client, args, out) -> int:
    target = Path(args.output or f"{args.job}.zip")
    size, digest, expected = client.download(_job_path(args.job) + "artifact/", target)
    note = " (matches the server's checksum)" if expected else ""
    print(f"{target}  {size} bytes  sha256 {digest}{note}", file=out)
    return 0


def _print_job_line(info: dict, out) -> None:
    archived = "  (archived)" if info.get("archived") else ""
    created = (info.get("created") or "")[:16].replace("T", " ")
    print(f"{info['job'][:8]}  {info['status']:<11} {created}  {info['name']}{archived}", file=out)


def cmd_jobs(client: Client, args, out) -> int:
    params = {}
    if args.all:
        params["show"] = "all"
    elif args.archived:
        params["show"] = "archived"
    if args.status:
        params["status"] = args.status
    if args.words:
        params["q"] = " ".join(args.words)
    path = "jobs/" + ("?" + urllib.parse.urlencode(params) if params else "")
    info = client.json("GET", path)
    if args.json:
        json.dump(info, out, indent=2)
        print(file=out)
        return 0
    for row in info["jobs"]:
        _print_job_line(row, out)
    if not info["jobs"]:
        print("no jobs" + (" match" if params else ""), file=out)
    return 0


def cmd_archive(client: Client, args, out) -> int:
    info = client.json("POST", _job_path(args.job) + "archive/")
    print(f"archived {info['job']} ({info['name']}): ptxf jobs --archived lists it", file=out)
    return 0


def cmd_unarchive(client: Client, args, out) -> int:
    info = client.json("POST", _job_path(args.job) + "unarchive/")
    print(f"{info['job']} ({info['name']}) is back on the job list", file=out)
    return 0


def _print_invitation(info: dict, out) -> None:
    until = (info.get("expires") or "")[:16].replace("T", " ")
    when = f"until {until}" if info["state"] == "open" else info["state"]
    print(
        f"{info['invitation'][:8]}  {info['state']:<8} {info['role']:<8} {info['email']}  "
        f"({info['org_name']}; {when})",
        file=out,
    )


def cmd_invite(client: Client, args, out) -> int:
    body = {"email": args.email, "role": args.role}
    if args.org:
        body["org"] = args.org
    info = client.json("POST", "invitations/", body)
    print(f"invitation {info['invitation']}: {info['email']} as {info['role']} of "
          f"{info['org_name']}, valid until {info['expires'][:16].replace('T', ' ')} UTC",
          file=out)  # fmt: skip
    if info.get("emailed"):
        print(f"emailed to {info['email']}; the link, shown this once:", file=out)
    else:
        print("the email could not be sent: pass this link on yourself (shown once):", file=out)
    print(info["link"], file=out)
    return 0


def cmd_invitations(client: Client, args, out) -> int:
    path = "invitations/" + ("?" + urllib.parse.urlencode({"org": args.org}) if args.org else "")
    info = client.json("GET", path)
    if args.json:
        json.dump(info, out, indent=2)
        print(file=out)
        return 0
    print(f"invitations to {info['org_name']} ({info['org']})", file=out)
    for row in info["invitations"]:
        _print_invitation(row, out)
    if not info["invitations"]:
        print("none sent yet", file=out)
    return 0


def cmd_withdraw_invitation(client: Client, args, out) -> int:
    info = client.json("POST", _code_path("invitations", args.invitation) + "withdraw/")
    print(f"withdrawn: the invitation of {info['email']} to {info['org_name']} opens nothing now",
          file=out)  # fmt: skip
    return 0


# -- ptxf import: PyTorch -> manifest, on the customer's machine ---------------------------------

IMPORT_HELP = """Translate a PyTorch function or nn.Module into a workload manifest.

This runs on YOUR machine and executes YOUR Python file: it is imported like any module (its
top-level code runs), then the function is traced with torch.export on placeholder tensors of
the example shapes (nothing is computed on them). Only the manifest it writes is ever uploaded;
the portal never runs customer Python. Needs torch 2.x.

TARGET is FILE.py:NAME or a dotted module:NAME. NAME is a function, an nn.Module instance, or an
nn.Module class that takes no constructor arguments. Parameters and buffers become inputs.

Example:
  ptxf import model.py:rmsnorm --example-shapes "x=16384x4096:bf16,w=4096:bf16" -o rmsnorm.toml
"""

IMPORT_DTYPES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "f16": "float16",
    "float16": "float16", "half": "float16", "fp32": "float32", "f32": "float32",
    "float32": "float32", "float": "float32", "int32": "int32", "int64": "int64",
    "long": "int64", "bool": "bool",
}  # fmt: skip


def parse_example_shapes(text: str) -> list[tuple[str, tuple[int, ...], str, tuple | None]]:
    """Parse NAME=SIZExSIZE[:DTYPE[:LOW..HIGH]] entries, comma-separated, such as
    "x=16384x4096:bf16,w=4096:bf16:0.5..1.5", into [(name, shape, torch dtype name, range)].
    A scalar input is "s=:fp32". Raises CliError (exit code 2) naming the bad entry."""
    out = []
    for entry in [e.strip() for e in text.split(",") if e.strip()]:
        name, eq, rest = entry.partition("=")
        parts = rest.split(":")
        if not eq or not name.strip().isidentifier() or not 1 <= len(parts) <= 3:
            raise CliError(
                f"--example-shapes: {entry!r} is not NAME=SIZExSIZE[:DTYPE[:LOW..HIGH]]", 2
            )
        shape_text, dtype = parts[0].strip(), (parts[1].strip() if len(parts) > 1 else "fp32")
        try:
            shape = tuple(int(s) for s in shape_text.lower().split("x")) if shape_text else ()
        except ValueError:
            raise CliError(f"--example-shapes: sizes in {entry!r} must be integers", 2) from None
        if any(s < 1 for s in shape):
            raise CliError(f"--example-shapes: sizes in {entry!r} must be positive", 2)
        if dtype.lower() not in IMPORT_DTYPES:
            raise CliError(
                f"--example-shapes: unknown dtype {dtype!r} in {entry!r} "
                "(bf16, fp16, fp32, int32, int64, bool)",
                2,
            )
        value_range = None
        if len(parts) == 3:
            low, dots, high = parts[2].partition("..")
            try:
                value_range = (float(low), float(high))
            except ValueError:
                value_range = None
            if not dots or value_range is None or not value_range[0] < value_range[1]:
                raise CliError(f"--example-shapes: range in {entry!r} must be LOW..HIGH", 2)
        out.append((name.strip(), shape, IMPORT_DTYPES[dtype.lower()], value_range))
    if not out:
        raise CliError("--example-shapes: give at least one input, e.g. x=1024x4096:bf16", 2)
    return out


def _parse_pairs(text: str, what: str) -> dict[str, str]:
    pairs = {}
    for entry in [e.strip() for e in (text or "").split(",") if e.strip()]:
        key, eq, value = entry.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CliError(f"{what}: {entry!r} is not KEY=VALUE", 2)
        pairs[key.strip()] = value.strip()
    return pairs


def load_target(target: str):
    """The object named by FILE.py:NAME or module:NAME, loaded by importing the customer's own
    code (on their machine, by design)."""
    import importlib
    import importlib.util

    where, colon, attr = target.rpartition(":")
    if not colon or not where or not attr:
        raise CliError(f"{target!r}: expected FILE.py:NAME or module:NAME", 2)
    path = Path(where)
    try:
        if where.endswith(".py") or path.is_file():
            if not path.is_file():
                raise CliError(f"{where}: no such file", 2)
            folder = str(path.resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)  # the file's own imports of its neighbours
            spec = importlib.util.spec_from_file_location(f"ptxf_import_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except CliError:
        raise
    except Exception as exc:  # noqa: BLE001 - the customer's file failed to import: say so
        raise CliError(f"importing {where} failed: {type(exc).__name__}: {exc}", 2) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{where} has no {attr!r}", 2)
        obj = getattr(obj, part)
    return obj


def cmd_import(_client, args, out) -> int:
    try:
        import torch
    except ImportError:
        raise CliError("ptxf import needs PyTorch 2.x installed on this machine", 2) from None
    from factory.torchimport import TranslationError, from_torch

    specs = parse_example_shapes(args.example_shapes)
    obj = load_target(args.target)
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        try:
            obj = obj()
        except TypeError as exc:
            raise CliError(
                f"{args.target}: the module needs constructor arguments ({exc}); name a "
                "module instance or a function instead",
                2,
            ) from None
    if isinstance(obj, torch.nn.Module):
        obj.eval()
    elif not callable(obj):
        raise CliError(f"{args.target} is not a function or an nn.Module", 2)
    # Placeholder tensors: on the meta device (no memory, nothing computed) unless the module's
    # parameters live somewhere else; zeros there (the value range then comes from the spec).
    params = list(obj.parameters()) if isinstance(obj, torch.nn.Module) else []
    devices = ["meta"] if not params else [params[0].device]
    if not params:
        devices.append("cpu")  # a function that makes its own CPU tensors cannot run on meta

    def examples(device):
        return [
            torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
            for _, shape, dtype, _ in specs
        ]

    dims = _parse_pairs(args.dims, "--dims")
    shapes = []
    for row in args.shape or []:
        try:
            shapes.append({k: int(v) for k, v in _parse_pairs(row, "--shape").items()})
        except ValueError:
            raise CliError(f"--shape: sizes in {row!r} must be integers", 2) from None
    ranges = {name: r for name, _, _, r in specs if r is not None}
    for device in devices:
        try:
            text = from_torch(
                obj,
                *examples(device),
                name=args.name,
                shapes=shapes,
                dims=dims or None,
                ranges=ranges,
            )
            break
        except TranslationError as exc:
            if device == devices[-1] or "device" not in str(exc):
                raise CliError(str(exc), 1) from None
    if args.output and args.output != "-":
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}: upload it (New workload page, or ptxf submit)", file=out)
    else:
        out.write(text)
    return 0


def from_torch(fn_or_module, *example_inputs, **options) -> str:
    """The Python API of `ptxf import`: factory.torchimport.from_torch (see there)."""
    from factory.torchimport import from_torch as translate

    return translate(fn_or_module, *example_inputs, **options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptxf",
        description="PTX Kernel Factory command-line client.",
        epilog="Set PTXF_URL (the portal's address) and PTXF_TOKEN (an API token, made on the "
        "portal's Tokens page); ptxf import needs neither. JOB, WORKLOAD and INVITATION are "
        "ids as the pages and ptxf show them: the full id or its first 8 characters. "
        "'ptxf COMMAND --help' tells more. Exit codes: 0 done, 1 refused by the server, "
        "2 bad usage or configuration, 3 the server could not be reached.",
    )
    parser.add_argument("--url", default=os.environ.get("PTXF_URL", "http://127.0.0.1:8000"))
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="submit a workload manifest and start a job")
    p.add_argument("manifest")
    p.add_argument("--baseline", help="your current kernel (.ptx or .cu)")
    p.add_argument("--generations", type=int)
    p.add_argument(
        "--per-row-length",
        action="store_true",
        help="a job for each row length of the manifest's shapes (the fastest kernel at each)",
    )
    p.add_argument("--wait", action="store_true", help="poll until the search is done")
    p.set_defaults(run=cmd_submit)
    p = sub.add_parser("status", help="a job's progress")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_status)
    p = sub.add_parser("results", help="a job's best kernel against the baselines")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--candidates",
        action="store_true",
        help="also every candidate, with its time or the reason it was refused",
    )
    p.set_defaults(run=cmd_results)
    p = sub.add_parser("cancel", help="cancel an active job (no review)")
    p.add_argument("job")
    p.set_defaults(run=cmd_cancel)
    p = sub.add_parser("stop", help="end a job's search now: its best verified kernel to review")
    p.add_argument("job")
    p.set_defaults(run=cmd_stop)
    p = sub.add_parser("rerun", help="start another job on a workload you uploaded")
    p.add_argument("workload", help="the workload's id (ptxf status shows it)")
    p.add_argument("--generations", type=int)
    p.add_argument("--wait", action="store_true", help="poll until the search is done")
    p.set_defaults(run=cmd_rerun)
    p = sub.add_parser("download", help="download an approved artifact")
    p.add_argument("job")
    p.add_argument("-o", "--output")
    p.set_defaults(run=cmd_download)
    p = sub.add_parser("jobs", help="your organisation's latest jobs (archived ones hidden)")
    p.add_argument("words", nargs="*", help="search: name, operator, status or id")
    show = p.add_mutually_exclusive_group()
    show.add_argument("--archived", action="store_true", help="only the archived jobs")
    show.add_argument("--all", action="store_true", help="archived jobs too")
    p.add_argument("--status", help="one status: active, queued, running, review, approved, ...")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_jobs)
    p = sub.add_parser("archive", help="hide a finished job from the job list (nothing is lost)")
    p.add_argument("job")
    p.set_defaults(run=cmd_archive)
    p = sub.add_parser("unarchive", help="put an archived job back on the job list")
    p.add_argument("job")
    p.set_defaults(run=cmd_unarchive)
    p = sub.add_parser(
        "invite",
        help="invite someone to your organisation by email (admins and engineers)",
        description="Invite someone by email. They get a one-time link, valid for 7 days, to "
        "make an account (or join with theirs). Admins invite customers and admins to their "
        "organisation; engineers invite to any organisation.",
    )
    p.add_argument("email")
    p.add_argument(
        "--role",
        default="customer",
        help="customer (default), admin (also manages the team), engineer (staff only)",
    )
    p.add_argument("--org", help="the organisation's id (default: your own)")
    p.set_defaults(run=cmd_invite)
    p = sub.add_parser("invitations", help="an organisation's invitations and their state")
    p.add_argument("--org", help="the organisation's id (default: your own)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_invitations)
    p = sub.add_parser(
        "withdraw-invitation",
        aliases=["revoke-invitation"],
        help="withdraw an open invitation (its link stops working)",
    )
    p.add_argument("invitation", help="the invitation's id (ptxf invitations shows it)")
    p.set_defaults(run=cmd_withdraw_invitation)
    p = sub.add_parser(
        "import",
        help="translate your PyTorch function into a manifest (runs your code, locally)",
        description=IMPORT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", help="FILE.py:NAME or module:NAME (a function or an nn.Module)")
    p.add_argument(
        "--example-shapes",
        required=True,
        help='inputs in order: "x=16384x4096:bf16,w=4096:bf16" (optional :LOW..HIGH range)',
    )
    p.add_argument("-o", "--output", help="the manifest file to write (default: print it)")
    p.add_argument("--name", help="the workload's name (default: the function's)")
    p.add_argument("--dims", help='name the axes yourself: "x=MxN,w=N"')
    p.add_argument(
        "--shape",
        action="append",
        help='another [[shapes]] row to optimise for, e.g. "M=32768,N=4096" (repeatable)',
    )
    p.set_defaults(run=cmd_import, local=True)
    return parser


def main(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "local", False):  # ptxf import: no server, no token
            return args.run(None, args, out)
        client = Client(args.url, os.environ.get("PTXF_TOKEN", ""))
        return args.run(client, args, out)
    except CliError as exc:
        print(f"ptxf: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
