"""Supervision: a child that dies is started again, the others keep running, and no child
outlives a killed supervisor. With `manage.py up`, a SIGKILLed worker comes back and the portal
keeps serving meanwhile."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

SUPERVISOR = """
import sys, time
from portal.management.supervise import Child, supervise
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
children = [Child(name=f"c{i}", argv=sleeper) for i in range(2)]
def restarted(child):
    print("restarted", child.name, child.pid, flush=True)
for c in children:
    c.start()
    print("started", c.name, c.pid, flush=True)
supervise(children, grace_s=5, on_restart=restarted, log=lambda t: print(t, flush=True))
print("stopped", flush=True)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of a dead supervisor is reaped by init soon; count it as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def supervisor(tmp_path):
    log = tmp_path / "supervise.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR],
            cwd=settings.BASE_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    yield proc, log
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def pids(log: Path, word: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(rf"^{word} (\w+) (\d+)$", log.read_text(), re.M)}


def test_a_sigkilled_child_is_started_again_and_the_other_keeps_running(supervisor):
    proc, log = supervisor
    first = wait_for(lambda: len(pids(log, "started")) == 2 and pids(log, "started"), 30, "start")
    os.kill(first["c0"], signal.SIGKILL)
    again = wait_for(lambda: pids(log, "restarted").get("c0"), 15, "the restart")
    assert again != first["c0"] and alive(again)
    assert alive(first["c1"])  # the other child was left alone
    assert proc.poll() is None  # and the supervisor goes on
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    assert "stopped" in log.read_text()
    assert not alive(again) and not alive(first["c1"])


def test_no_child_outlives_a_killed_supervisor(supervisor):
    proc, log = supervisor
    first = wait_for(lambda: len(pids(log, "started")) == 2 and pids(log, "started"), 30, "start")
    proc.kill()  # SIGKILL: no chance to stop its children itself
    proc.wait()
    for pid in first.values():
        wait_for(lambda pid=pid: not alive(pid), 10, f"child {pid} to die with its parent")


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def shell(env, code: str) -> str:
    return (
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )


def test_up_restarts_a_sigkilled_worker_and_keeps_serving(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["PTXF_VAR_DIR"] = str(tmp_path / "var")
    log = tmp_path / "up.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--addr", f"127.0.0.1:{port}"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    login = f"http://127.0.0.1:{port}/accounts/login/"
    try:
        wait_for(lambda: "is up" in log.read_text() or proc.poll() is not None, 240, "up")
        assert proc.poll() is None, log.read_text()
        assert "after cpu@previous-run: re-sent 0 task(s)" in log.read_text()  # at start
        ready = tmp_path / "var" / "run"
        cpu = next(ready.glob("cpu@*.ready"))
        worker_pid = int(cpu.read_text())
        # A job whose task was lost: queued, with no message in the broker.
        lost = shell(
            env,
            "from django.contrib.auth import get_user_model; "
            "from factory.spec import catalogue_manifest; "
            "from portal import services; from portal.models import Organisation; "
            "u = get_user_model().objects.get(username='demo'); "
            "w = services.workload_create(org=Organisation.objects.get(name='Acme'), user=u, "
            "manifest=catalogue_manifest('softmax')); "
            "print(services.job_create(workload=w, user=u, start=False).code)",
        )
        forked = children_of(worker_pid)
        assert forked  # its prefork pool (and beat)
        os.kill(worker_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # the web server answers meanwhile
        with urllib.request.urlopen(login, timeout=10) as response:  # noqa: S310
            assert response.status == 200
        wait_for(
            lambda: re.search(r"after cpu@(?!previous-run)\S+: re-sent", log.read_text()),
            60,
            "the supervisor to restart it and re-send the active jobs' tasks",
        )
        new_pid = wait_for(
            lambda: (
                cpu.exists()
                and int(cpu.read_text() or 0) not in (0, worker_pid)
                and int(cpu.read_text())
            ),
            120,
            "the new worker to consume its queues",
        )
        assert alive(new_pid)
        # nothing the dead worker forked (its pool children, its beat) lives on as an orphan
        wait_for(lambda: not [p for p in forked if alive(p)], 20, "the old worker's children to go")
        status = f"from portal.models import Job; print(Job.objects.get(code='{lost}').status)"
        wait_for(lambda: shell(env, status) != "queued", 120, "the lost job to move")
        assert time.monotonic() - killed_at < 60 + 30  # a minute, and slack for a busy box
        with urllib.request.urlopen(login, timeout=10) as response:  # noqa: S310
            assert response.status == 200
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_up_production_serves_through_gunicorn_with_whitenoise(tmp_path):
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DEBUG", "SECRET_KEY")
    }
    env.update(
        PTXF_VAR_DIR=str(tmp_path / "var"),
        PRODUCTION="1",
        SECRET_KEY="a-fifty-character-or-longer-random-secret-key-for-this-test-0123",
        TRUST_X_FORWARDED_PROTO="1",  # TLS ends at a proxy: this test is the proxy
        ALLOWED_HOSTS="127.0.0.1",
        WEB_CONCURRENCY="2",
    )
    log = tmp_path / "up.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--production", "--no-workers"]
            + ["--addr", f"127.0.0.1:{port}"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: "is up" in log.read_text() or proc.poll() is not None, 240, "up")
        text = log.read_text()
        assert proc.poll() is None and "gunicorn" in text.lower(), text
        assert "demo /" not in text  # no published demo login in production
        plain = urllib.request.build_opener(NoRedirects)
        try:
            plain.open(base + "/accounts/login/", timeout=10)
        except urllib.error.HTTPError as exc:  # plain http is sent to https
            assert exc.code == 301 and exc.headers["Location"].startswith("https://")
        else:
            raise AssertionError("plain http was not redirected to https")
        proxied = urllib.request.Request(
            base + "/accounts/login/", headers={"X-Forwarded-Proto": "https"}
        )
        with urllib.request.urlopen(proxied, timeout=10) as response:  # noqa: S310
            page = response.read().decode()
            assert response.headers["Content-Security-Policy"]
            assert "max-age=31536000" in response.headers["Strict-Transport-Security"]
        script = re.search(r'src="(/static/django_htmx/htmx-2\.min\.[0-9a-f]+\.js)"', page)
        assert script, "hashed static names from collectstatic's manifest"
        static = urllib.request.Request(
            base + script.group(1), headers={"X-Forwarded-Proto": "https"}
        )
        with urllib.request.urlopen(static, timeout=10) as response:  # noqa: S310
            assert response.status == 200 and "max-age=315360000" in response.headers.get(
                "Cache-Control", ""
            )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
