"""What an upload may be, for the upload form and the API alike: size limits, the kernel file
extensions, and text checks that need no spec (encoding, NUL bytes, control characters). Each
check raises a ValidationError that says what is wrong. The customer's kernel is also compiled
with nvJitLink at upload (`compile_customer_ptx`), in a capped child process."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from django.core.exceptions import ValidationError

MANIFEST_MAX_BYTES = 64 * 1024
BASELINE_MAX_BYTES = 512 * 1024
BASELINE_EXTENSIONS = {".ptx": "ptx", ".cu": "cuda", ".cuh": "cuda"}


def decode_text(data: bytes, *, what: str, max_bytes: int) -> str:
    """Bytes from an upload to text, or a ValidationError that says what is wrong with them."""
    if len(data) > max_bytes:
        raise ValidationError(
            f"The {what} is {len(data):,} bytes; the limit is {max_bytes:,} bytes."
        )
    if not data.strip():
        raise ValidationError(f"The {what} is empty.")
    if b"\x00" in data:
        raise ValidationError(f"The {what} contains NUL bytes: it looks like a binary file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            f"The {what} is not UTF-8 text (byte {exc.start} cannot be decoded)."
        ) from None
    return check_text(text, what=what)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_text(text: str, *, what: str) -> str:
    if "\x00" in text:
        raise ValidationError(f"The {what} contains NUL bytes: it looks like a binary file.")
    match = _CONTROL.search(text)
    if match:
        line = text.count("\n", 0, match.start()) + 1
        raise ValidationError(
            f"The {what} contains a control character (0x{ord(match.group()):02x}) on line "
            f"{line}; upload plain text."
        )
    return text


# --- the customer's PTX, compiled at upload -------------------------------------------------------

# A compile gets this much wall time and CPU time, and this much address space; its log is cut to
# JITLINK_MAX_MESSAGES lines. PTX is at most kernels.MAX_PTX_BYTES (checked by the spec first).
JITLINK_TIMEOUT_S = float(os.environ.get("PTXF_JITLINK_TIMEOUT_S") or 30)
JITLINK_MAX_MESSAGES = 20
_PTXAS_LINE = re.compile(r"^ptxas[^,]*, line (\d+); (error|fatal)\s*:\s*(.*)$")


def compile_customer_ptx(ptx: str, *, target: str, field: str = "baseline.source") -> dict:
    """Compile the customer's kernel (PTX as uploaded, or what NVRTC made of their CUDA C) for
    `target` with nvJitLink on this CPU, as every candidate is compiled, so PTX that ptxas
    refuses is refused at upload instead of failing on a GPU host later.

    Runs in a child process with caps on CPU time, memory and wall time (JITLINK_TIMEOUT_S),
    holding one of the compile slots the NVRTC compiles use (PTXF_NVRTC_SLOTS), so a compile
    bomb costs a bounded share of one core. Returns {"registers", "spill_bytes",
    "nvjitlink_version"} of a clean compile; raises SpecError on `field` with ptxas's messages
    otherwise. Clean compiles are remembered by (sha256 of the PTX, target) for this process,
    as the same upload is validated more than once."""
    from factory.spec import SpecError, kernels

    key = (hashlib.sha256(ptx.encode("utf-8")).hexdigest(), target)
    if key in _LINKED:
        return _LINKED[key]
    request = json.dumps({"ptx": ptx, "arch": target, "root": str(_ROOT)})
    env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH", "CUDA_PATH") if k in os.environ}
    env["PTXF_JITLINK_PARENT"] = str(os.getpid())
    for name in ("PTXF_JITLINK_CPU_S", "PTXF_JITLINK_MEMORY_BYTES"):
        if name in os.environ:
            env[name] = os.environ[name]
    try:
        slot = kernels._compile_slot(field)
        slot.__enter__()
    except SpecError:
        raise SpecError(
            [(field, "the compilers are busy with other uploads: try again in a minute")]
        ) from None
    try:
        try:
            proc = subprocess.Popen(
                [os.environ.get("PTXF_PYTHON") or sys.executable, "-I", str(_CHILD)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd=tempfile.gettempdir(),
                start_new_session=True,
            )
        except OSError:
            raise SpecError([(field, "the PTX compiler could not be started")]) from None
        try:
            out, _ = proc.communicate(request.encode(), timeout=JITLINK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise SpecError(
                [(field, f"compiling the PTX took longer than {JITLINK_TIMEOUT_S:g} s")]
            ) from None
    finally:
        slot.__exit__(None, None, None)
    try:
        result = json.loads(out) if proc.returncode == 0 else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise SpecError([(field, "the PTX compiler failed (out of memory or CPU time?)")])
    if not result.get("ok"):
        raise SpecError([(field, m) for m in compiler_messages(str(result.get("log", "")))])
    facts = {k: result.get(k) for k in ("registers", "spill_bytes", "nvjitlink_version")}
    if len(_LINKED) >= 32:
        _LINKED.pop(next(iter(_LINKED)))
    _LINKED[key] = facts
    return facts


def compiler_messages(log: str) -> list[str]:
    """ptxas's errors as lines a customer can act on: 'line 12: error: ...' for each, at most
    JITLINK_MAX_MESSAGES; the first lines of the log where it holds none in that form."""
    found = []
    for raw in log.splitlines():
        match = _PTXAS_LINE.match(raw.strip())
        if match:
            found.append(f"line {match.group(1)}: {match.group(2)}: {match.group(3).strip()}")
    if not found:
        found = [line.strip() for line in log.splitlines() if line.strip()]
    if not found:
        return ["the PTX does not compile (ptxas gave no message)"]
    shown = [f"does not compile: {m}"[:500] for m in found[:JITLINK_MAX_MESSAGES]]
    if len(found) > len(shown):
        shown.append(f"({len(found) - len(shown)} more messages)")
    return shown


_ROOT = Path(__file__).resolve().parents[1]
_CHILD = Path(__file__).with_name("_jitlink_child.py")
# Clean compiles of this process, by (sha256 of the PTX, target), oldest first.
_LINKED: dict[tuple[str, str], dict] = {}
