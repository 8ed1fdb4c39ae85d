"""Customer CUDA is compiled outside the database transaction, once per upload, in a child that
dies with its parent, and no more compilers run at once than there are slots."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from factory.spec import SpecError, kernels
from portal import services

EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
CUDA_MANIFEST = (EXAMPLES / "rmsnorm_cuda.toml").read_text()
CUDA_SOURCE = (EXAMPLES / "rmsnorm_cuda.cu").read_text()


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "_COMPILED", {})
    monkeypatch.setenv("PTXF_NVRTC_SLOT_DIR", str(tmp_path / "slots"))


def test_a_cuda_upload_is_compiled_once_and_outside_the_transaction(
    db, orgs, customer, monkeypatch, fresh_cache
):
    depth_at_test = len(connection.atomic_blocks)
    seen = []
    real = kernels.compile_cuda

    def spy(source, **kwargs):
        seen.append(len(connection.atomic_blocks) - depth_at_test)
        return real(source, **kwargs)

    monkeypatch.setattr(kernels, "compile_cuda", spy)
    jobs = services.submit(
        org=orgs[0],
        user=customer,
        manifests=[CUDA_MANIFEST],
        baseline_source=CUDA_SOURCE,
        baseline_filename="rmsnorm_cuda.cu",
    )
    assert jobs and seen[0] == 0  # the first (real) compile held no transaction
    assert len(kernels._COMPILED) == 1  # the second validation read the cache


def test_no_slot_free_refuses_the_compile_with_a_message(monkeypatch, fresh_cache):
    import fcntl

    monkeypatch.setenv("PTXF_NVRTC_SLOTS", "1")
    monkeypatch.setenv("PTXF_NVRTC_WAIT_S", "0.3")
    folder = Path(os.environ["PTXF_NVRTC_SLOT_DIR"])
    folder.mkdir(parents=True)
    with open(folder / "slot0", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process is compiling
        with pytest.raises(SpecError, match="compiler is busy"):
            kernels.compile_cuda(CUDA_SOURCE)
    assert "rmsnorm_naive" in kernels.compile_cuda(CUDA_SOURCE)  # free again


def test_the_compiler_child_dies_with_a_killed_parent(tmp_path, fresh_cache):
    # A stand-in compiler (PTXF_PYTHON runs it) that records its pid and hangs; the parent is a
    # process that calls compile_cuda, then is SIGKILLed as a web server would be.
    fake = tmp_path / "fake_python"
    pidfile = tmp_path / "child.pid"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        "sys.path.insert(0, os.path.dirname(sys.argv[-1]))\n"
        "import _nvrtc_child as c\n"
        "c._die_with_parent()\n"
        f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    fake.chmod(0o755)
    parent_code = (
        "from factory.spec import kernels; "
        "kernels.compile_cuda('__global__ void k() {}', timeout_s=100)"
    )
    env = {**os.environ, "PTXF_PYTHON": str(fake)}
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=env, cwd=EXAMPLES.parents[1])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            assert parent.poll() is None
            time.sleep(0.1)
        child = int(pidfile.read_text())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            stat = Path(f"/proc/{child}/stat").read_text().split()[2]
            if stat == "Z":
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the compiler outlived its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
