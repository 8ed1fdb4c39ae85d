"""Issue 52: a forgotten password is reset by email through Django's own views, on the site's
pages: the login page links it, the email carries a one-time link, the new password works and
the link then opens nothing."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _mailbox(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def _link(message) -> str:
    found = re.search(r"https?://[^/\s]+(/accounts/password-reset/[^\s]+/)", message.body)
    assert found, message.body
    return found.group(1)


def test_the_login_page_links_the_reset_and_the_reset_page_is_the_sites(client):
    page = client.get(reverse("login")).content.decode()
    assert reverse("password_reset") in page
    reset = client.get(reverse("password_reset"))
    assert reset.status_code == 200
    body = reset.content.decode()
    assert "css/portal.css" in body and "Reset your password" in body  # the site's template
    assert 'name="email"' in body


def test_a_customer_resets_a_forgotten_password_with_the_emailed_link(client, customer):
    customer.email = "alice@example.com"
    customer.save()
    response = client.post(reverse("password_reset"), {"email": "ALICE@example.com"})
    assert response.status_code == 302 and response["Location"] == reverse("password_reset_done")
    assert "Check your email" in client.get(response["Location"]).content.decode()
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.com"]
    assert "Choose a new password" in message.subject
    assert "alice" in message.body

    link = _link(message)
    form = client.get(link, follow=True)
    assert form.status_code == 200 and "Choose a new password" in form.content.decode()
    set_url = form.redirect_chain[-1][0] if form.redirect_chain else link
    done = client.post(
        set_url, {"new_password1": "a-new-long-pass-52", "new_password2": "a-new-long-pass-52"}
    )
    assert done.status_code == 302 and done["Location"] == reverse("password_reset_complete")
    assert "Password set" in client.get(done["Location"]).content.decode()

    customer.refresh_from_db()
    assert customer.check_password("a-new-long-pass-52")
    assert not customer.check_password("alice-pass")
    # the link was for one use: it opens nothing now
    again = client.get(link, follow=True).content.decode()
    assert 'id="invalid-link"' in again


def test_an_unknown_address_gets_the_same_answer_and_no_email(client, customer):
    response = client.post(reverse("password_reset"), {"email": "nobody@example.com"})
    assert response.status_code == 302 and response["Location"] == reverse("password_reset_done")
    assert mail.outbox == []


def test_a_forged_link_opens_nothing(client, customer):
    url = reverse("password_reset_confirm", kwargs={"uidb64": "MQ", "token": "set-password"})
    page = client.get(url, follow=True).content.decode()
    assert 'id="invalid-link"' in page
    User = get_user_model()
    assert User.objects.get(pk=customer.pk).check_password("alice-pass")
