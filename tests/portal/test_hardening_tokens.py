"""API tokens expire, and a read-only token may only read."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from factory.spec import catalogue_manifest
from portal import services
from portal.models import ApiToken

pytestmark = pytest.mark.django_db


def bearer(key):
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_a_token_expires_after_the_configured_days(client, customer, settings):
    settings.API_TOKEN_DAYS = 30
    key, token = services.api_token_create(user=customer, name="ci")
    assert timedelta(days=29) < token.expires - timezone.now() <= timedelta(days=30)
    assert client.get(reverse("api-jobs"), **bearer(key)).status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(seconds=1))
    response = client.get(reverse("api-jobs"), **bearer(key))
    assert response.status_code == 401 and "expired" in response.json()["error"]


def test_zero_days_makes_a_token_that_never_expires(customer, settings):
    settings.API_TOKEN_DAYS = 0
    _, token = services.api_token_create(user=customer)
    assert token.expires is None


def test_a_read_only_token_reads_but_may_not_submit(client, customer):
    key, _ = services.api_token_create(user=customer, scope="read")
    assert client.get(reverse("api-jobs"), **bearer(key)).status_code == 200
    response = client.post(
        reverse("api-jobs"),
        {"manifest": catalogue_manifest("softmax")},
        content_type="application/json",
        **bearer(key),
    )
    assert response.status_code == 403 and "read" in response.json()["error"]


def test_an_unknown_scope_is_refused(customer):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        services.api_token_create(user=customer, scope="admin")
