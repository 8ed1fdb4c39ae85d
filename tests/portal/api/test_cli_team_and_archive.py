"""`ptxf jobs`, `ptxf archive` / `unarchive`, `ptxf invite`, `ptxf invitations` and
`ptxf withdraw-invitation` against the real API on a live server."""

import io
import re

import pytest
from django.core import mail

from portal import cli, services
from portal.models import Invitation, Membership
from tests.portal.conftest import _user
from tests.portal.web.world import job_in_review


@pytest.fixture
def as_user(live_server, monkeypatch, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    monkeypatch.setenv("PTXF_URL", live_server.url)

    def login(user):
        key, _ = services.api_token_create(user=user, name="cli")
        monkeypatch.setenv("PTXF_TOKEN", key)

        def run(*argv):
            out = io.StringIO()
            code = cli.main(list(argv), out=out)
            return code, out.getvalue()

        return run

    return login


@pytest.fixture
def admin(orgs):
    return _user("ada", orgs[0], Membership.ROLE_ADMIN)


@pytest.fixture
def finished(orgs, customer, settings, tmp_path, transactional_db):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, name="layernorm")
    job.status = "rejected"
    job.save(update_fields=["status"])
    return job


def test_archive_hides_a_job_from_ptxf_jobs_and_unarchive_brings_it_back(
    as_user, customer, finished
):
    ptxf = as_user(customer)
    short = str(finished.code)[:8]
    code, out = ptxf("jobs")
    assert code == 0 and short in out and "layernorm" in out
    code, out = ptxf("archive", short)
    assert code == 0 and f"archived {finished.code} (layernorm)" in out
    assert short not in ptxf("jobs")[1]
    code, out = ptxf("jobs", "--archived")
    assert code == 0 and short in out and "(archived)" in out
    code, out = ptxf("unarchive", short)
    assert code == 0 and "back on the job list" in out
    assert short in ptxf("jobs")[1]


def test_archiving_a_job_twice_prints_the_servers_reason(as_user, customer, finished, capsys):
    ptxf = as_user(customer)
    assert ptxf("archive", str(finished.code))[0] == 0
    assert ptxf("archive", str(finished.code))[0] == 1
    assert "HTTP 409: The job is archived already." in capsys.readouterr().err


def test_a_bad_status_filter_prints_the_field(as_user, customer, finished, capsys):
    code, _ = as_user(customer)("jobs", "--status", "finished")
    assert code == 1
    err = capsys.readouterr().err
    assert "HTTP 400" in err and "status: one of active" in err


def test_an_admin_invites_lists_and_withdraws_from_the_command_line(
    as_user, admin, transactional_db
):
    ptxf = as_user(admin)
    code, out = ptxf("invite", "bob@acme.example", "--role", "admin")
    assert code == 0, out
    assert "bob@acme.example as admin of Acme" in out and "emailed to bob@acme.example" in out
    (message,) = mail.outbox
    link = re.search(r"https?://\S+/invitations/\S+/", out).group(0)
    assert link in message.body
    invitation = Invitation.objects.get()
    code, out = ptxf("invitations")
    assert code == 0 and "invitations to Acme" in out
    assert f"{str(invitation.code)[:8]}  open     admin    bob@acme.example" in out
    assert link not in out
    code, out = ptxf("withdraw-invitation", str(invitation.code)[:8])
    assert code == 0 and "bob@acme.example" in out
    assert Invitation.objects.get().state == "revoked"
    assert "revoked" in ptxf("invitations")[1]


def test_a_customer_is_told_who_may_invite(as_user, customer, transactional_db, capsys):
    code, _ = as_user(customer)("invite", "bob@acme.example")
    assert code == 1
    assert "HTTP 403" in capsys.readouterr().err
    assert not Invitation.objects.exists()


def test_an_unknown_role_is_refused_with_the_roles_allowed(
    as_user, admin, transactional_db, capsys
):
    code, _ = as_user(admin)("invite", "bob@acme.example", "--role", "engineer")
    assert code == 1
    assert "role: one of customer, admin" in capsys.readouterr().err


def test_the_help_names_every_command():
    text = " ".join(cli.build_parser().format_help().split())
    for command in ("archive", "unarchive", "jobs", "invite", "invitations", "withdraw-invitation"):
        assert command in text
    assert "PTXF_TOKEN" in text and "first 8 characters" in text
