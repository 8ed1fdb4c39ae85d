"""The latency benchmark's own accounting (bench/portal_latency.py): the server's CPU a phase
and how the report states it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from bench import portal_latency

# a third of a CPU-second, then idle until killed
BURN = (
    "import time\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.3: pass\n"
    "time.sleep(30)"
)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_server_cpu_counts_the_processes_of_the_servers_session():
    proc = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        used = 0.0
        while time.monotonic() < deadline and used < 0.3:
            time.sleep(0.1)
            used = portal_latency.server_cpu_s(proc.pid, "")
        assert 0.3 <= used < 5.0
        # another session's processes are not this server's
        assert portal_latency.server_cpu_s(os.getsid(0), "") != used
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_report_states_each_phases_server_cpu():
    report = {
        "date": "2026-12-07T14:05:00+00:00",
        "database": "postgresql",
        "data": {"candidates": 2000},
        "clients": 8,
        "requests_per_endpoint": 40,
        "server": "gunicorn portal.wsgi:application",
        "machine": {
            "cpu": "AMD EPYC",
            "cpus": 2,
            "memory_gib": 23.5,
            "platform": "Linux",
            "loadavg_1m_at_start": 1.0,
            "loadavg_1m_at_end": 3.0,
        },
        "versions": {
            "postgresql": "15",
            "python": "3.11",
            "django": "5.2",
            "gunicorn": "23",
            "whitenoise": "6",
            "psycopg": "3",
        },
        "git_commit": "abc1234",
        "analyzed_after_fill": True,
        "phases": [
            {
                "phase": "searching",
                "requests": 1120,
                "wall_s": 12.5,
                "server_cpu_s": 16.8,
                "server_cpu_ms_per_request": 15.0,
            }
        ],
        "endpoints": [{"endpoint": "job", "p50_ms": 80.0, "p95_ms": 150.0, "max_ms": 200.0}],
        "target_p95_ms": 300.0,
        "all_under_target": True,
        "worst": {"endpoint": "job", "p95_ms": 150.0},
    }
    text = portal_latency.markdown(report)
    assert "used 16.8 CPU-s, 15.0 ms a request" in text
    assert "ANALYZE ran after the fill." in text
    assert "| job | 80.0 | 150.0 | 200.0 |" in text
    assert "met by every endpoint" in text
