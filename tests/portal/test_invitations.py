"""Issue 52: invitations and roles without the Django admin. An engineer (or an organisation's
admin) invites someone by email; the one-time link makes an account in the organisation with
the invited role; a used, withdrawn or expired link opens nothing. Customers, admins and
engineers each see and do what their role allows, on the pages and in the API."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from portal import accounts, services
from portal.models import AuditEvent, Invitation, Membership, sha256_hex
from tests.portal.conftest import _user
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture(autouse=True)
def _mailbox(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture
def admin(orgs):
    """Ada, an admin of Acme."""
    return _user("ada", orgs[0], Membership.ROLE_ADMIN)


def _invite(client, org, email, role="customer"):
    return client.post(reverse("web-team"), {"email": email, "role": role, "org": str(org.code)})


def _link_path(message) -> str:
    found = re.search(r"https?://[^/\s]+(/invitations/[^\s]+/)", message.body)
    assert found, message.body
    return found.group(1)


def _accept(client, path, username="newbie", password="a-long-pass-2026"):
    return client.post(path, {"username": username, "password1": password, "password2": password})


def test_an_engineer_invites_a_customer_who_joins_with_the_emailed_link(
    client, engineer, orgs, outsider, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    globex_job = job_in_review(orgs[1], outsider, name="globex_norm")
    acme_job = job_in_review(orgs[0], engineer, name="acme_norm")
    client.force_login(engineer)
    response = _invite(client, orgs[1], "grace@globex.example")
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["grace@globex.example"] and "Globex" in message.subject
    path = _link_path(message)
    assert path in page and 'id="fresh-link"' in page  # shown once, beside the email
    assert path not in client.get(reverse("web-team") + f"?org={orgs[1].code}").content.decode()
    invitation = Invitation.objects.get()
    secret = path.rstrip("/").rsplit("/", 1)[1]
    assert invitation.secret_sha256 == sha256_hex(secret)
    assert secret not in str(Invitation.objects.values().get())  # only the hash is kept
    assert invitation.expires - invitation.created == timedelta(days=accounts.INVITATION_DAYS)
    assert AuditEvent.objects.filter(verb="invitation.create").exists()

    client.logout()
    opened = client.get(path).content.decode()
    assert "Join Globex" in opened and "grace@globex.example" in opened
    response = _accept(client, path, username="grace")
    assert response.status_code == 302
    grace = User.objects.get(username="grace")
    assert grace.email == "grace@globex.example"
    assert Membership.objects.get(user=grace).org == orgs[1]
    assert Membership.objects.get(user=grace).role == Membership.ROLE_CUSTOMER
    # logged in, and sees Globex's jobs only
    home = client.get(reverse("web-home")).content.decode()
    assert "globex_norm" in home and "acme_norm" not in home
    assert client.get(reverse("web-job", args=[acme_job.code])).status_code == 404
    assert client.get(reverse("web-job", args=[globex_job.code])).status_code == 200
    invitation.refresh_from_db()
    assert invitation.state == "accepted" and invitation.accepted_by == grace

    # the link works once
    client.logout()
    again = client.get(path)
    assert again.status_code == 410 and "used already" in again.content.decode()
    assert _accept(client, path, username="mallory").status_code == 410
    assert not User.objects.filter(username="mallory").exists()


def test_an_expired_or_withdrawn_or_unknown_link_opens_nothing(client, engineer, orgs):
    invitation, secret = accounts.invitation_create(
        user=engineer, org=orgs[0], email="late@acme.example", role="customer"
    )
    path = reverse("web-invitation-accept", args=[secret])
    Invitation.objects.filter(pk=invitation.pk).update(expires=timezone.now() - timedelta(1))
    expired = client.get(path)
    assert expired.status_code == 410 and "expired" in expired.content.decode()
    assert _accept(client, path).status_code == 410
    assert not User.objects.filter(username="newbie").exists()

    invitation, secret = accounts.invitation_create(
        user=engineer, org=orgs[0], email="gone@acme.example", role="customer"
    )
    client.force_login(engineer)
    client.post(reverse("web-invitation-revoke", args=[invitation.code]))
    client.logout()
    path = reverse("web-invitation-accept", args=[secret])
    withdrawn = client.get(path)
    assert withdrawn.status_code == 410 and "withdrawn" in withdrawn.content.decode()
    assert _accept(client, path).status_code == 410

    unknown = client.get(reverse("web-invitation-accept", args=["not-a-real-secret"]))
    assert unknown.status_code == 404 and "opens nothing" in unknown.content.decode()


def test_a_weak_password_or_a_taken_username_is_answered_and_the_link_stays_open(
    client, engineer, customer, orgs
):
    _, secret = accounts.invitation_create(
        user=engineer, org=orgs[0], email="bob@acme.example", role="customer"
    )
    path = reverse("web-invitation-accept", args=[secret])
    weak = _accept(client, path, password="123")
    assert weak.status_code == 400 and "errorlist" in weak.content.decode()
    taken = _accept(client, path, username="ALICE")
    assert taken.status_code == 400 and "taken" in taken.content.decode()
    assert Invitation.objects.get().state == "open"
    assert _accept(client, path, username="bob").status_code == 302


def test_a_signed_in_user_joins_another_organisation_with_the_link(client, engineer, orgs):
    carol = _user("carol", orgs[1], Membership.ROLE_CUSTOMER)
    _, secret = accounts.invitation_create(
        user=engineer, org=orgs[0], email="carol@example.com", role="customer"
    )
    client.force_login(carol)
    path = reverse("web-invitation-accept", args=[secret])
    assert "You are logged in as" in client.get(path).content.decode()
    assert client.post(path).status_code == 302
    assert set(Membership.objects.filter(user=carol).values_list("org__name", flat=True)) == {
        "Acme",
        "Globex",
    }


def test_an_address_is_invited_once_at_a_time_and_never_when_already_a_member(
    client, engineer, customer, orgs
):
    customer.email = "alice@acme.example"
    customer.save()
    client.force_login(engineer)
    member = _invite(client, orgs[0], "Alice@acme.example")
    assert member.status_code == 400 and "already a member" in member.content.decode()
    assert _invite(client, orgs[0], "dan@acme.example").status_code == 302
    twice = _invite(client, orgs[0], "dan@acme.example")
    assert twice.status_code == 400 and "open invitation" in twice.content.decode()
    assert Invitation.objects.count() == 1


def test_a_customer_has_no_team_page_and_cannot_invite(client, customer, engineer, orgs):
    client.force_login(customer)
    assert client.get(reverse("web-team")).status_code == 404
    assert _invite(client, orgs[0], "x@acme.example").status_code == 404
    invitation, _ = accounts.invitation_create(
        user=engineer, org=orgs[0], email="y@acme.example", role="customer"
    )
    assert client.post(reverse("web-invitation-revoke", args=[invitation.code])).status_code == 404
    assert Invitation.objects.get().state == "open"
    assert reverse("web-team") not in client.get(reverse("web-home")).content.decode()


def test_an_admin_invites_to_their_own_organisation_only_and_never_an_engineer(client, admin, orgs):
    client.force_login(admin)
    page = client.get(reverse("web-team")).content.decode()
    assert "Team of Acme" in page and reverse("web-team") in page  # in the navigation
    assert "Globex" not in page
    assert _invite(client, orgs[0], "eve@acme.example", role="admin").status_code == 302
    assert Invitation.objects.get().role == Membership.ROLE_ADMIN
    # another organisation, or the engineer role: refused by the form
    assert _invite(client, orgs[1], "spy@globex.example").status_code == 400
    assert _invite(client, orgs[0], "eng@acme.example", role="engineer").status_code == 400
    assert Invitation.objects.count() == 1
    # and by the rules themselves, whatever page calls them
    with pytest.raises(accounts.PermissionDenied):
        accounts.invitation_create(user=admin, org=orgs[1], email="a@b.example", role="customer")
    with pytest.raises(accounts.PermissionDenied):
        accounts.invitation_create(user=admin, org=orgs[0], email="a@b.example", role="engineer")


def test_only_a_staff_engineer_invites_an_engineer(client, engineer, orgs):
    plain = _user("pat", orgs[0], Membership.ROLE_ENGINEER, staff=False)
    client.force_login(plain)
    assert _invite(client, orgs[0], "eng1@acme.example", role="engineer").status_code == 400
    engineer.is_staff = True
    engineer.save()
    client.force_login(engineer)
    assert _invite(client, orgs[0], "eng2@acme.example", role="engineer").status_code == 302
    assert Invitation.objects.get().role == Membership.ROLE_ENGINEER


def test_an_admin_is_a_customer_of_their_organisation_on_the_pages(
    client, admin, orgs, outsider, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    theirs = job_in_review(orgs[1], outsider, name="globex_only")
    ours = job_in_review(orgs[0], admin, name="acme_admins")
    client.force_login(admin)
    assert client.get(reverse("web-review-queue")).status_code == 404
    assert client.get(reverse("web-review", args=[ours.code])).status_code == 404
    assert client.get(reverse("web-evidence")).status_code == 404
    assert client.get(reverse("web-job", args=[theirs.code])).status_code == 404
    assert client.get(reverse("web-job", args=[ours.code])).status_code == 200
    assert client.get(reverse("web-upload")).status_code == 200  # uploads for Acme


def test_roles_hold_in_the_api(client, admin, customer, orgs, outsider, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    theirs = job_in_review(orgs[1], outsider, name="globex_api")
    ours = job_in_review(orgs[0], customer, name="acme_api")
    for user in (admin, customer):
        key, _ = services.api_token_create(user=user, name="test")
        auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
        listed = client.get(reverse("api-jobs"), **auth)
        assert listed.status_code == 200
        body = listed.content.decode()
        assert str(ours.code) in body and str(theirs.code) not in body
        assert client.get(reverse("api-job", args=[theirs.code]), **auth).status_code == 404
        assert client.get(reverse("api-job", args=[ours.code]), **auth).status_code == 200


def _change(client, org, username, role):
    return client.post(
        reverse("web-team-member", args=[org.code, username]), {"role": role}, follow=True
    )


def test_an_admin_changes_and_removes_customers_but_not_engineers_nor_themselves(
    client, admin, customer, engineer, orgs
):
    client.force_login(admin)
    page = client.get(reverse("web-team")).content.decode()
    assert reverse("web-team-member", args=[orgs[0].code, "alice"]) in page
    assert reverse("web-team-member", args=[orgs[0].code, "erin"]) not in page  # an engineer
    assert reverse("web-team-member", args=[orgs[0].code, "ada"]) not in page  # themselves

    _change(client, orgs[0], "alice", Membership.ROLE_ADMIN)
    assert Membership.objects.get(user=customer).role == Membership.ROLE_ADMIN
    assert AuditEvent.objects.filter(verb="membership.role").exists()
    refused = _change(client, orgs[0], "erin", Membership.ROLE_CUSTOMER).content.decode()
    assert "may not change" in refused
    assert Membership.objects.get(user=engineer).role == Membership.ROLE_ENGINEER
    _change(client, orgs[0], "alice", Membership.ROLE_ENGINEER)
    assert Membership.objects.get(user=customer).role == Membership.ROLE_ADMIN
    own = _change(client, orgs[0], "ada", Membership.ROLE_CUSTOMER).content.decode()
    assert "your own membership" in own
    assert Membership.objects.get(user=admin).role == Membership.ROLE_ADMIN

    _change(client, orgs[0], "alice", "remove")
    assert not Membership.objects.filter(user=customer).exists()
    assert AuditEvent.objects.filter(verb="membership.remove").exists()


def test_a_customer_or_another_organisations_admin_changes_nobody(
    client, admin, customer, outsider, orgs
):
    client.force_login(customer)
    response = client.post(
        reverse("web-team-member", args=[orgs[0].code, "ada"]), {"role": "remove"}
    )
    assert response.status_code == 404
    client.force_login(admin)
    response = client.post(
        reverse("web-team-member", args=[orgs[1].code, outsider.username]), {"role": "remove"}
    )
    assert response.status_code == 404
    assert Membership.objects.filter(user=outsider).exists()
    assert Membership.objects.get(user=admin).role == Membership.ROLE_ADMIN


def test_an_engineer_changes_members_of_any_organisation(client, engineer, outsider, orgs):
    client.force_login(engineer)
    _change(client, orgs[1], outsider.username, Membership.ROLE_ADMIN)
    assert Membership.objects.get(user=outsider).role == Membership.ROLE_ADMIN
