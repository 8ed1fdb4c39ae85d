"""Runs in a child process (python -I): compile one CUDA C source to PTX with NVRTC.

Reads JSON {source, name, arch, headers: {include name: text}} on stdin, writes JSON {ok, ptx,
log} on stdout. Limits are set first, before any customer text is looked at. Only this file and
cuda.bindings are imported; the parent filters the log before anyone sees it."""

import json
import resource
import sys


def _limit(which: int, value: int) -> None:
    try:
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):
        pass


def _die_with_parent() -> None:
    """SIGKILL when the process that started us dies (Linux prctl PR_SET_PDEATHSIG), so a
    compile never outlives a killed web server; if it already died, stop now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import os
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.environ.get("PTXF_NVRTC_PARENT")
    if parent and os.getppid() != int(parent):
        os._exit(1)


def main() -> None:
    _die_with_parent()
    _limit(resource.RLIMIT_CPU, 60)
    _limit(resource.RLIMIT_AS, 8 * 2**30)
    _limit(resource.RLIMIT_FSIZE, 0)  # NVRTC needs no files; writing one is a bug or an attack
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_NOFILE, 64)
    request = json.loads(sys.stdin.read())
    from cuda.bindings import nvrtc

    names = sorted(request["headers"])
    contents = [request["headers"][n].encode() for n in names]
    err, prog = nvrtc.nvrtcCreateProgram(
        request["source"].encode(), request["name"].encode(), len(names), contents,
        [n.encode() for n in names],
    )  # fmt: skip
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        json.dump({"ok": False, "ptx": "", "log": f"nvrtcCreateProgram failed: {err}"}, sys.stdout)
        return
    options = [
        f"--gpu-architecture=compute_{request['arch']}".encode(),
        b"--std=c++17",
        b"--no-source-include",  # never search the source's folder for includes
    ]
    (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    ptx = b""
    if result == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
    nvrtc.nvrtcDestroyProgram(prog)
    json.dump(
        {
            "ok": result == nvrtc.nvrtcResult.NVRTC_SUCCESS,
            "ptx": ptx.rstrip(b"\0").decode("ascii", "replace"),
            "log": log.rstrip(b"\0").decode("utf-8", "replace"),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
