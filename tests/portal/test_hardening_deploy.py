"""`manage.py check --deploy` is clean with the production environment that docs/DEPLOYMENT.md
documents, and the security settings follow the environment."""

import os
import re
import subprocess
import sys

from django.conf import settings

DOC = settings.BASE_DIR / "docs" / "DEPLOYMENT.md"


def documented_env() -> dict[str, str]:
    text = DOC.read_text()
    block = text.split("<!-- production-env -->", 1)[1].split("<!-- /production-env -->", 1)[0]
    env = {}
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("export "):
            continue
        for name, value in re.findall(r'(\w+)=("[^"]*"|\S+)', line[len("export ") :]):
            env[name] = value
    return env


def run_manage(env_overrides: dict, *args, tmp_path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECURE_", "SESSION_", "CSRF_", "AXES_"))
        and k
        not in (
            "DATABASE_URL",
            "CELERY_BROKER_URL",
            "CACHE_URL",
            "DEBUG",
            "PRODUCTION",
            "SECRET_KEY",
        )
    }
    env.update(env_overrides, PTXF_VAR_DIR=str(tmp_path / "var"))
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_documented_production_environment_passes_check_deploy(tmp_path):
    env = documented_env()
    assert env["PRODUCTION"] == "1" and "DATABASE_URL" in env
    env["SECRET_KEY"] = "a-fifty-character-or-longer-random-secret-key-for-this-test-0123"
    result = run_manage(env, "check", "--deploy", "--fail-level", "WARNING", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_cache_url_shares_one_redis_cache_and_refuses_anything_else(tmp_path):
    show = "from django.conf import settings as s; print(s.CACHES['default']['BACKEND'])"
    result = run_manage({}, "shell", "-c", show, tmp_path=tmp_path)
    assert result.returncode == 0 and "LocMemCache" in result.stdout, result.stderr
    env = {"CACHE_URL": documented_env()["CACHE_URL"]}
    result = run_manage(env, "shell", "-c", show, tmp_path=tmp_path)
    assert result.returncode == 0 and "RedisCache" in result.stdout, result.stderr
    result = run_manage({"CACHE_URL": "memcached://cache:11211"}, "check", tmp_path=tmp_path)
    assert result.returncode != 0 and "CACHE_URL" in result.stderr


def test_without_production_settings_check_deploy_warns(tmp_path):
    result = run_manage({}, "check", "--deploy", "--fail-level", "WARNING", tmp_path=tmp_path)
    assert result.returncode != 0
    assert "security.W004" in result.stderr or "security.W004" in result.stdout  # HSTS


def test_production_refuses_debug_and_a_missing_secret_key(tmp_path):
    result = run_manage({"PRODUCTION": "1"}, "check", tmp_path=tmp_path)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr
    result = run_manage(
        {"PRODUCTION": "1", "DEBUG": "1", "SECRET_KEY": "k" * 60}, "check", tmp_path=tmp_path
    )
    assert result.returncode != 0 and "DEBUG" in result.stderr


def test_every_answer_carries_the_content_security_policy(client, db):
    response = client.get("/accounts/login/")
    policy = response["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "script-src 'self'" in policy and "http" not in policy  # no other origin
    assert response["X-Request-ID"]


def test_static_files_are_served_by_whitenoise_without_collectstatic(client, db):
    response = client.get("/static/django_htmx/htmx-2.min.js")
    assert response.status_code == 200
