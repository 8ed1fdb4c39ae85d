"""Invitations through the JSON API: the Team page's rules (who may invite whom), the same
email, listing and withdrawing, and a JSON error with a 4xx status for every bad request."""

import json
import re

import pytest
from django.core import mail
from django.urls import reverse

from portal import services
from portal.models import AuditEvent, Invitation, Membership
from tests.portal.conftest import _user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _mailbox(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture
def admin(orgs):
    """Ada, an admin of Acme."""
    return _user("ada", orgs[0], Membership.ROLE_ADMIN)


def _auth(user, scope="write"):
    key, _ = services.api_token_create(user=user, name="test", scope=scope)
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _invite(client, user, body, **extra):
    return client.post(
        reverse("api-invitations"),
        data=json.dumps(body),
        content_type="application/json",
        **(extra or _auth(user)),
    )


def test_an_admin_invites_by_api_and_the_same_email_goes_out(client, admin, orgs):
    response = _invite(client, admin, {"email": "bob@acme.example", "role": "customer"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["email"] == "bob@acme.example" and body["role"] == "customer"
    assert body["org"] == str(orgs[0].code) and body["state"] == "open"
    assert body["emailed"] is True and body["invited_by"] == "ada"
    (message,) = mail.outbox
    assert message.to == ["bob@acme.example"]
    assert "invites you to Acme" in message.subject + message.body
    # The link in the answer is the emailed one, and it opens the invitation page.
    assert body["link"] in message.body
    path = re.search(r"https?://[^/\s]+(/invitations/[^\s]+/)", body["link"]).group(1)
    assert client.get(path).status_code == 200
    invitation = Invitation.objects.get()
    assert str(invitation.code) == body["invitation"]
    assert AuditEvent.objects.filter(verb="invitation.create", actor=admin).exists()


def test_the_link_is_shown_once_and_the_list_never_carries_it(client, admin):
    made = _invite(client, admin, {"email": "bob@acme.example"}).json()
    listed = client.get(reverse("api-invitations"), **_auth(admin)).json()
    assert [i["invitation"] for i in listed["invitations"]] == [made["invitation"]]
    assert "link" not in listed["invitations"][0]
    assert made["link"].split("/")[-2] not in json.dumps(listed)


def test_a_customer_may_not_invite_nor_list_and_is_told_why(client, customer):
    response = _invite(client, customer, {"email": "x@acme.example"})
    assert response.status_code == 403
    assert "admins" in response.json()["error"]
    assert client.get(reverse("api-invitations"), **_auth(customer)).status_code == 403
    assert not Invitation.objects.exists() and not mail.outbox


def test_an_admin_hands_out_customer_and_admin_but_not_engineer(client, admin):
    assert _invite(client, admin, {"email": "a@acme.example", "role": "admin"}).status_code == 201
    response = _invite(client, admin, {"email": "e@acme.example", "role": "engineer"})
    assert response.status_code == 400
    assert response.json()["errors"] == [["role", "one of customer, admin"]]
    assert Invitation.objects.count() == 1


def test_an_admin_cannot_invite_to_another_organisation(client, admin, orgs):
    response = _invite(client, admin, {"email": "g@globex.example", "org": str(orgs[1].code)})
    assert response.status_code == 404 and response.json()["error"]
    assert not Invitation.objects.exists()


def test_a_staff_engineer_invites_an_engineer_to_another_organisation(client, engineer, orgs):
    body = {"email": "eve@globex.example", "role": "engineer", "org": str(orgs[1].code)[:8]}
    response = _invite(client, engineer, body)
    assert response.status_code == 201, response.content
    assert response.json()["org_name"] == "Globex"
    listed = client.get(
        reverse("api-invitations") + f"?org={orgs[1].code}", **_auth(engineer)
    ).json()
    assert listed["org_name"] == "Globex" and len(listed["invitations"]) == 1
    assert "engineer" in listed["roles"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "email"),
        ({"email": ""}, "email"),
        ({"email": 42}, "email"),
        ({"email": "not-an-address"}, "email"),
        ({"email": "x" * 250 + "@a.example"}, "email"),
        ({"email": "b@acme.example", "role": "owner"}, "role"),
        ({"email": "b@acme.example", "role": None}, "role"),
        ({"email": "b@acme.example", "org": 7}, "org"),
    ],
)
def test_bad_invitations_get_a_json_error_naming_the_field(client, admin, body, field):
    response = _invite(client, admin, body)
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert field in [f for f, _ in response.json()["errors"]]
    assert not Invitation.objects.exists()


def test_a_body_that_is_not_a_json_object_is_refused_in_json(client, admin):
    url = reverse("api-invitations")
    for data, content_type, status in (
        ("email=b@acme.example", "application/x-www-form-urlencoded", 415),
        ("{not json", "application/json", 400),
        ('["b@acme.example"]', "application/json", 400),
        (b"\xff\xfe", "application/json", 400),
    ):
        response = client.post(url, data=data, content_type=content_type, **_auth(admin))
        assert response.status_code == status, (data, response.content)
        assert response["Content-Type"] == "application/json" and response.json()["error"]


def test_a_second_invitation_of_an_open_address_or_a_member_is_409(client, admin, customer):
    customer.email = "alice@acme.example"
    customer.save()
    assert _invite(client, admin, {"email": "b@acme.example"}).status_code == 201
    again = _invite(client, admin, {"email": "B@acme.example"})
    assert again.status_code == 409 and "already has an open invitation" in again.json()["error"]
    member = _invite(client, admin, {"email": "alice@acme.example"})
    assert member.status_code == 409 and "already a member" in member.json()["error"]
    assert len(mail.outbox) == 1


def test_a_read_only_token_lists_but_does_not_invite(client, admin):
    response = _invite(client, admin, {"email": "b@acme.example"}, **_auth(admin, scope="read"))
    assert response.status_code == 403
    assert client.get(reverse("api-invitations"), **_auth(admin, scope="read")).status_code == 200


def test_an_invitation_is_withdrawn_by_api_and_its_link_opens_nothing(client, admin):
    made = _invite(client, admin, {"email": "b@acme.example"}).json()
    url = reverse("api-invitation-withdraw", args=[made["invitation"][:8]])
    response = client.post(url, **_auth(admin))
    assert response.status_code == 200 and response.json()["state"] == "revoked"
    path = re.search(r"https?://[^/\s]+(/invitations/[^\s]+/)", made["link"]).group(1)
    assert client.get(path).status_code == 410
    again = client.post(url, **_auth(admin))
    assert again.status_code == 409 and "revoked" in again.json()["error"]
    assert client.get(url, **_auth(admin)).status_code == 405


def test_another_organisations_invitation_is_404_to_an_admin(client, admin, engineer, orgs):
    theirs = _invite(client, engineer, {"email": "g@globex.example", "org": str(orgs[1].code)})
    url = reverse("api-invitation-withdraw", args=[theirs.json()["invitation"]])
    response = client.post(url, **_auth(admin))
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert Invitation.objects.get().state == "open"


def test_an_unknown_organisation_in_the_list_is_a_json_404(client, admin):
    for org in ("ffffffff", "nope", "ffffffff-ffff-ffff-ffff-ffffffffffff"):
        response = client.get(reverse("api-invitations") + f"?org={org}", **_auth(admin))
        assert response.status_code == 404 and response.json()["error"], org
