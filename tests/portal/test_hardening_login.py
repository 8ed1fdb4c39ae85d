"""Login throttling (django-axes) and the demo accounts: 20 wrong passwords lock the account for
a while; the demo logins exist only in the embedded default, once, and never as superusers."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


def login(client, username, password):
    return client.post(reverse("login"), {"username": username, "password": password})


def logged_in(client):
    return "_auth_user_id" in client.session


def test_twenty_wrong_passwords_lock_the_account_even_for_the_right_one(customer, settings):
    settings.AXES_FAILURE_LIMIT = 20
    client = Client()
    for _ in range(19):
        assert login(client, "alice", "wrong").status_code == 200
    # 19 wrong: still the form; the right password works and clears the count
    assert login(client, "alice", "alice-pass").status_code == 302
    client.logout()
    for _ in range(20):
        login(client, "alice", "wrong")
    # another browser at another address, the right password
    response = login(Client(REMOTE_ADDR="10.9.9.9"), "alice", "alice-pass")
    assert response.status_code == 429 and not logged_in(client)


def test_a_locked_account_does_not_lock_the_others(customer, engineer):
    client = Client(REMOTE_ADDR="10.0.0.1")
    for _ in range(20):
        login(client, "alice", "wrong")
    assert login(Client(REMOTE_ADDR="10.0.0.2"), "erin", "erin-pass").status_code == 302


def test_twenty_failures_from_one_address_lock_that_address(customer, engineer):
    client = Client(REMOTE_ADDR="10.0.0.3")
    for i in range(20):
        login(client, f"nobody{i}", "wrong")  # password spraying over many names
    assert login(client, "erin", "erin-pass").status_code == 429
    assert login(Client(REMOTE_ADDR="10.0.0.4"), "erin", "erin-pass").status_code == 302


def test_the_lock_expires_after_the_cool_off(customer, settings):
    from datetime import timedelta

    from axes.models import AccessAttempt
    from django.utils import timezone

    client = Client()
    for _ in range(20):
        login(client, "alice", "wrong")
    assert login(client, "alice", "alice-pass").status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(hours=1))
    assert login(client, "alice", "alice-pass").status_code == 302


def test_seed_demo_creates_the_accounts_once_and_never_a_superuser(settings):
    settings.DEMO_ACCOUNTS = True
    call_command("seed_demo", stdout=StringIO())
    User = get_user_model()
    engineer = User.objects.get(username="engineer")
    assert engineer.is_staff and not engineer.is_superuser
    assert not User.objects.filter(is_superuser=True).exists()
    engineer.set_password("changed-by-the-operator")
    engineer.save()
    call_command("seed_demo", stdout=StringIO())  # a second run changes nothing
    engineer.refresh_from_db()
    assert engineer.check_password("changed-by-the-operator")
    assert User.objects.count() == 3


def test_seed_demo_is_refused_outside_the_embedded_default(settings):
    settings.DEMO_ACCOUNTS = False
    with pytest.raises(CommandError, match="embedded default"):
        call_command("seed_demo", stdout=StringIO())
    assert not get_user_model().objects.exists()


def test_demo_accounts_left_from_a_demo_run_are_disabled(settings):
    from portal.management.commands.seed_demo import demo_accounts_disable

    settings.DEMO_ACCOUNTS = True
    call_command("seed_demo", stdout=StringIO())
    assert demo_accounts_disable() == 3
    assert login(Client(), "demo", "demo-pass-2026").status_code == 200  # the form again
    assert not get_user_model().objects.filter(is_active=True).exists()


@pytest.mark.parametrize(
    ("env", "allowed"),
    [
        ({}, True),
        ({"DEBUG": "0"}, False),
        ({"DEBUG": "false"}, False),
        ({"DEBUG": "1"}, True),
        ({"DATABASE_URL": "postgres://u:p@localhost/x"}, False),
        ({"PRODUCTION": "1", "SECRET_KEY": "k" * 60}, False),
    ],
)
def test_the_demo_accounts_belong_to_the_embedded_default_only(env, allowed, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from django.conf import settings

    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DEBUG", "PRODUCTION", "SECRET_KEY", "CELERY_BROKER_URL")
    }
    clean.update(env, PTXF_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings")
    code = "import json; from portal import settings as s; print(json.dumps(s.DEMO_ACCOUNTS))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=clean,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) is allowed
