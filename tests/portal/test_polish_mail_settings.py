"""The SMTP backend's port, login and TLS come from the environment (docs/DEPLOYMENT.md), with
defaults that keep a local relay on port 25 without login or encryption; bad values stop the
process at start and name the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.portal.test_hardening_deploy import documented_env

MAIL_VARS = (
    "EMAIL_HOST",
    "EMAIL_PORT",
    "EMAIL_HOST_USER",
    "EMAIL_HOST_PASSWORD",
    "EMAIL_USE_TLS",
    "EMAIL_USE_SSL",
    "DEFAULT_FROM_EMAIL",
)

# What Django's mail connection is made with, as the portal's settings configure it.
PROBE = """
import json, django
django.setup()
from django.core.mail import get_connection
c = get_connection()
print(json.dumps({"backend": type(c).__module__, "host": getattr(c, "host", None),
    "port": getattr(c, "port", None), "username": getattr(c, "username", None),
    "password": getattr(c, "password", None), "use_tls": getattr(c, "use_tls", None),
    "use_ssl": getattr(c, "use_ssl", None)}))
"""


def _connection(tmp_path, **env) -> tuple[int, dict | None, str]:
    full = {k: v for k, v in os.environ.items() if k not in MAIL_VARS}
    full.update(env, DJANGO_SETTINGS_MODULE="portal.settings", PTXF_VAR_DIR=str(tmp_path / "var"))
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=full,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    return out.returncode, got, out.stderr


def test_without_a_mail_host_mail_goes_to_the_console(tmp_path):
    code, got, err = _connection(tmp_path)
    assert code == 0, err
    assert got["backend"] == "django.core.mail.backends.console"


def test_a_mail_host_alone_keeps_port_25_without_login_or_encryption(tmp_path):
    code, got, err = _connection(tmp_path, EMAIL_HOST="relay.internal")
    assert code == 0, err
    assert got == {
        "backend": "django.core.mail.backends.smtp",
        "host": "relay.internal",
        "port": 25,
        "username": "",
        "password": "",
        "use_tls": False,
        "use_ssl": False,
    }


def test_port_login_and_starttls_reach_the_smtp_connection(tmp_path):
    code, got, err = _connection(
        tmp_path,
        EMAIL_HOST="smtp.example.com",
        EMAIL_PORT="587",
        EMAIL_HOST_USER="factory",
        EMAIL_HOST_PASSWORD="s3cret with spaces",
        EMAIL_USE_TLS="yes",
    )
    assert code == 0, err
    assert (got["port"], got["username"], got["password"]) == (587, "factory", "s3cret with spaces")
    assert got["use_tls"] is True and got["use_ssl"] is False


def test_implicit_tls_reaches_the_smtp_connection(tmp_path):
    code, got, err = _connection(
        tmp_path, EMAIL_HOST="smtp.example.com", EMAIL_PORT="465", EMAIL_USE_SSL="1"
    )
    assert code == 0, err
    assert got["port"] == 465 and got["use_ssl"] is True and got["use_tls"] is False


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"EMAIL_PORT": "smtp"}, "EMAIL_PORT"),
        ({"EMAIL_PORT": "0"}, "EMAIL_PORT"),
        ({"EMAIL_PORT": "70000"}, "EMAIL_PORT"),
        ({"EMAIL_USE_TLS": "maybe"}, "EMAIL_USE_TLS"),
        ({"EMAIL_USE_SSL": "sometimes"}, "EMAIL_USE_SSL"),
        ({"EMAIL_USE_TLS": "1", "EMAIL_USE_SSL": "1"}, "EMAIL_USE_SSL"),
    ],
)
def test_a_bad_mail_setting_stops_the_process_and_names_it(tmp_path, env, named):
    code, _, err = _connection(tmp_path, EMAIL_HOST="smtp.example.com", **env)
    assert code != 0
    assert "ImproperlyConfigured" in err and named in err


def test_the_documented_production_environment_configures_authenticated_starttls():
    env = documented_env()
    assert env["EMAIL_HOST"] and env["EMAIL_PORT"] == "587" and env["EMAIL_USE_TLS"] == "1"
    assert env["EMAIL_HOST_USER"] and "EMAIL_HOST_PASSWORD" in env
    assert "EMAIL_USE_SSL" not in env
