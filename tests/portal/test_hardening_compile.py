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


def test_logins_and_submissions_answer_within_a_second_while_four_compiles_run(tmp_path):
    """Four slow customer compiles in flight (a stand-in compiler that takes 8 s) through the
    real embedded portal: a login and an ordinary submission still answer within a second."""
    import http.cookiejar
    import json
    import re
    import socket
    import threading
    import urllib.parse
    import urllib.request

    from django.conf import settings

    from factory.spec import catalogue_manifest

    slow = tmp_path / "slow_compiler"
    slow.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, time\n"
        "sys.stdin.read()\n"
        "time.sleep(8)\n"
        "json.dump({'ok': False, 'ptx': '', 'log': 'error: too slow to be useful'}, sys.stdout)\n"
    )
    slow.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        PTXF_VAR_DIR=str(tmp_path / "var"),
        PTXF_PYTHON=str(slow),
        PTXF_NVRTC_SLOT_DIR=str(tmp_path / "slots"),
        PTXF_NVRTC_SLOTS="4",
    )
    log = tmp_path / "up.log"
    with open(log, "w") as out:
        up = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--no-workers", "--addr", f"127.0.0.1:{port}"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while "is up" not in log.read_text() and time.monotonic() < deadline:
            assert up.poll() is None, log.read_text()
            time.sleep(0.3)
        key = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c",
             "from django.contrib.auth import get_user_model; from portal import services; "
             "u = get_user_model().objects.get(username='demo'); "
             "print(services.api_token_create(user=u, name='t')[0])"],
            cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip

        def api_post(body):
            request = urllib.request.Request(
                base + "/api/v1/jobs/",
                data=json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code

        bomb = {
            "manifest": CUDA_MANIFEST,
            "baseline_source": CUDA_SOURCE,
            "baseline_filename": "rmsnorm_cuda.cu",
        }
        answers = []

        def send_bomb():
            began = time.monotonic()
            status = api_post(bomb)
            answers.append((status, time.monotonic() - began))

        bombs = [threading.Thread(target=send_bomb) for _ in range(4)]
        for t in bombs:
            t.start()
        time.sleep(1.5)  # the four compiles are running now
        assert not answers

        started = time.monotonic()
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login = base + "/accounts/login/"
        page = opener.open(login, timeout=10).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": token, "username": "demo", "password": "demo-pass-2026"}
        ).encode()
        home = opener.open(urllib.request.Request(login, data=form, headers={"Referer": login}))
        login_s = time.monotonic() - started
        assert home.status == 200 and home.url == base + "/"

        started = time.monotonic()
        status = api_post({"manifest": catalogue_manifest("softmax")})
        submit_s = time.monotonic() - started
        assert status == 201
        assert not answers  # the compiles were still running meanwhile
        assert login_s < 1.0 and submit_s < 1.0, (login_s, submit_s)
        for t in bombs:
            t.join(timeout=60)
        # each refused with the compiler's message after its 8 s compile, none a 500
        assert [status for status, _ in answers] == [400] * 4
        assert all(seconds >= 7 for _, seconds in answers), answers
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
