"""`manage.py up` (what ./scripts/up runs) brings the embedded portal up with its workers, and
the demo customer can log in and see the home page."""

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from django.conf import settings


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_serves_the_portal_and_the_demo_customer_logs_in(tmp_path):
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
    try:
        deadline = time.monotonic() + 240  # web server, then the worker on a busy 2-core box
        while "is up" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.3)
        text = log.read_text()
        assert f"http://127.0.0.1:{port}/" in text and "demo / demo-pass-2026" in text
        assert re.search(r"workers ready: .*cpu@", text), text  # the worker consumes its queues

        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login_url = f"http://127.0.0.1:{port}/accounts/login/"
        page = opener.open(login_url, timeout=10).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": token, "username": "demo", "password": "demo-pass-2026"}
        ).encode()
        request = urllib.request.Request(login_url, data=form, headers={"Referer": login_url})
        home = opener.open(request, timeout=10)  # follows the redirect to the home page
        assert home.status == 200
        assert home.url == f"http://127.0.0.1:{port}/"
        assert "demo" in home.read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
