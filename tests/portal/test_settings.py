"""Settings come from the environment, and a bad value stops the process loudly."""

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.celery import celery_config
from portal.settings import database_from_url, envbool, envint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_settings(**env):
    """Import the settings in a fresh interpreter with `env` added; (returncode, stderr)."""
    full = {**os.environ, **env, "PTXF_VAR_DIR": os.environ.get("PTXF_VAR_DIR", "/tmp/ptxf-st")}
    for name, value in env.items():
        if value is None:
            full.pop(name)
    out = subprocess.run(
        [sys.executable, "-c", "import portal.settings"],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode, out.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEBUG", "maybe"),
        ("FACTORY_POPULATION", "many"),
        ("FACTORY_GENERATIONS", "0"),
        ("DATABASE_URL", "mysql://db/ptxf"),
        ("CELERY_BROKER_URL", "amqp://guest@localhost//"),
        ("FACTORY_BACKEND", "oracle"),
        ("SECRET_KEY", "short"),
    ],
)
def test_a_bad_value_stops_the_settings_and_names_the_variable(name, value):
    returncode, stderr = load_settings(**{name: value})
    assert returncode != 0
    assert "ImproperlyConfigured" in stderr and name in stderr


def test_the_anthropic_backend_without_a_key_is_refused():
    returncode, stderr = load_settings(FACTORY_BACKEND="anthropic", ANTHROPIC_API_KEY="")
    assert returncode != 0 and "ANTHROPIC_API_KEY" in stderr


def test_good_values_load():
    assert load_settings(DEBUG="yes", FACTORY_POPULATION="3")[0] == 0


def test_helpers_take_the_usual_spellings(monkeypatch):
    monkeypatch.setenv("X_FLAG", "off")
    monkeypatch.setenv("X_NUM", "12")
    assert envbool("X_FLAG", True) is False
    assert envint("X_NUM", 1, minimum=1) == 12
    monkeypatch.setenv("X_NUM", "-1")
    with pytest.raises(ImproperlyConfigured, match="X_NUM"):
        envint("X_NUM", 1, minimum=0)


def test_a_postgres_url_becomes_a_django_database():
    db = database_from_url("postgres://ptx:p%40ss@db.internal:6543/factory?sslmode=require")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"]) == ("factory", "ptx", "p@ss")
    assert (db["HOST"], db["PORT"]) == ("db.internal", "6543")
    assert db["OPTIONS"] == {"sslmode": "require"}


def test_a_database_url_without_a_name_is_refused():
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        database_from_url("postgres://localhost:5432/")


def test_sqlite_runs_with_wal_immediate_transactions_and_a_timeout(tmp_path):
    db = database_from_url(f"sqlite://{tmp_path}/x.sqlite3")
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert db["OPTIONS"]["timeout"] > 0
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]


def test_on_redis_tasks_are_acked_late_one_at_a_time_and_outlive_their_visibility_timeout():
    config = celery_config({"CELERY_BROKER_URL": "redis://localhost:6379/0"})
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert config["worker_prefetch_multiplier"] == 1
    options = config["broker_transport_options"]
    assert options["visibility_timeout"] > 1800  # the GPU batch's hard limit
    assert options["unacked_restore_interval"] <= 1


def test_without_a_broker_url_celery_uses_the_filesystem_transport():
    config = celery_config({})
    assert config["broker_url"] == "filesystem://"
    assert config["broker_transport_options"]["data_folder_in"].endswith("broker/messages")


def test_tasks_the_tests_publish_stay_out_of_the_checkouts_broker_folder():
    # (tests/conftest.py: else the next `./scripts/up` here would run them on its own jobs)
    from portal.celery import app, broker_dir

    if app.conf.broker_url != "filesystem://":
        pytest.skip("a broker is configured (CI's Redis database for tests)")
    folders = [v for k, v in app.conf.broker_transport_options.items() if "folder" in k]
    assert len(folders) == 4
    assert not any(f.startswith(str(broker_dir())) for f in folders)


def test_every_pipeline_task_has_a_queue():
    config = celery_config({})
    queues = {q.name for q in config["task_queues"]}
    assert {"agents", "build", "gpu.sm_90", "gpu.sm_100", "default"} <= queues
    assert config["task_routes"]["portal.generation_propose"]["queue"] == "agents"
    assert config["task_routes"]["portal.candidate_build"]["queue"] == "build"


def _compile_cache_of_a_django_process(**env) -> str:
    full = {
        **os.environ,
        "PTXF_VAR_DIR": "/tmp/ptxf-st",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    full.pop("COMPILE_CACHE_DIR", None)
    full.update(env)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from factory.compile import cache_dir; "
            "print(cache_dir())",
        ],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_portals_processes_keep_compile_reports_under_var_unless_told_otherwise():
    assert _compile_cache_of_a_django_process() == "/tmp/ptxf-st/compile-cache"
    assert _compile_cache_of_a_django_process(COMPILE_CACHE_DIR="/srv/cc") == "/srv/cc"
    assert _compile_cache_of_a_django_process(COMPILE_CACHE_DIR="off") == "None"
