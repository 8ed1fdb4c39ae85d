"""The portal latency benchmark's own arithmetic and guards (no database, no server)."""

import pytest

from bench import portal_latency as bench


def test_the_nearest_rank_percentile():
    times = sorted(float(i) for i in range(1, 101))
    assert bench.percentile(times, 0.95) == 95.0
    assert bench.percentile(times, 0.5) == 50.0
    assert bench.percentile([7.0], 0.95) == 7.0
    assert bench.percentile(sorted([3.0, 1.0, 2.0]), 0.95) == 3.0


@pytest.mark.parametrize("name", ["ptxf", "ptxf_ci", "postgres", "template1"])
def test_it_refuses_to_drop_a_database_it_does_not_own(name):
    with pytest.raises(SystemExit, match="refusing to drop"):
        bench.fresh_database(f"postgres:///{name}")


def test_a_sqlite_database_is_a_file_deleted_first(tmp_path):
    path = tmp_path / "bench.sqlite3"
    path.write_text("old")
    bench.fresh_database(f"sqlite:///{path}")
    assert not path.exists()


def test_the_server_runs_with_the_documented_production_settings(tmp_path):
    env = bench.server_environment(tmp_path, "postgres:///ptxf_bench", "k" * 50)
    assert env["PRODUCTION"] == "1" and env["DEBUG"] == "0"
    assert env["TRUST_X_FORWARDED_PROTO"] == "1"
    assert env["DATABASE_URL"] == "postgres:///ptxf_bench"


def test_the_report_says_whether_the_target_was_met():
    report = {
        "date": "2026-12-07T10:00:00+00:00",
        "database": "postgresql",
        "server": "python -m gunicorn portal.wsgi:application",
        "clients": 8,
        "requests_per_endpoint": 40,
        "machine": {
            "cpu": "x",
            "cpus": 2,
            "memory_gib": 8,
            "platform": "p",
            "loadavg_1m_at_end": 1,
        },
        "versions": {k: "1" for k in ("python", "django", "gunicorn", "whitenoise", "psycopg")}
        | {"postgresql": "15"},
        "git_commit": "abc",
        "data": {"candidates": 2000},
        "target_p95_ms": 300.0,
        "all_under_target": False,
        "worst": {"endpoint": "job", "p95_ms": 412.0},
        "endpoints": [{"endpoint": "job", "p50_ms": 200.0, "p95_ms": 412.0, "max_ms": 500.0}],
    }
    text = bench.markdown(report)
    assert "| job | 200.0 | 412.0 | 500.0 |" in text
    assert "NOT met" in text and "8 concurrent clients" in text
