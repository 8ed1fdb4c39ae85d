"""Runs in a child process (python -I): compile one customer PTX text with nvJitLink.

Reads JSON {"ptx", "arch", "root"} on stdin and writes JSON {"ok", "log", "registers",
"spill_bytes", "nvjitlink_version"} on stdout. The limits (CPU seconds, address space, no files
written, no core dump) are set before the PTX is looked at, and the child is SIGKILLed when the
process that started it dies, so a compile bomb cannot outlive or outlast its request."""

import json
import os
import resource
import sys


def _limit(which: int, value: int) -> None:
    try:
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):
        pass


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.environ.get("PTXF_JITLINK_PARENT")
    if parent and os.getppid() != int(parent):
        os._exit(1)  # the parent died before the line above took effect


def main() -> None:
    _die_with_parent()
    _limit(resource.RLIMIT_CPU, int(os.environ.get("PTXF_JITLINK_CPU_S") or 20))
    _limit(resource.RLIMIT_AS, int(os.environ.get("PTXF_JITLINK_MEMORY_BYTES") or 4 * 2**30))
    _limit(resource.RLIMIT_FSIZE, 0)
    _limit(resource.RLIMIT_CORE, 0)
    request = json.loads(sys.stdin.read())
    sys.path.insert(0, request["root"])  # the project, for factory.compile
    from factory.compile import compile_ptx

    report = compile_ptx(request["ptx"], request["arch"], cache=False)
    json.dump(
        {
            "ok": report.ok,
            "log": report.log[:20_000],
            "registers": report.registers,
            "spill_bytes": report.spill_store_bytes + report.spill_load_bytes,
            "nvjitlink_version": report.nvjitlink_version,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
