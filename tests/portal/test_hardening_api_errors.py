"""Every API error is JSON with a status and a message; bodies are bounded before parsing; an
unhandled exception is logged with its traceback and answered with a correlation id."""

import contextlib
import json
import logging

import pytest
from django.test import Client
from django.urls import reverse

from portal import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def token(customer):
    key, _ = services.api_token_create(user=customer, name="test")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def post_json(client, url, text, token, **extra):
    return client.generic(
        "POST", url, text.encode("utf-8", "surrogatepass"), "application/json", **token, **extra
    )


@contextlib.contextmanager
def request_log(caplog):
    """caplog on django.request, which does not propagate to the root logger."""
    logger = logging.getLogger("django.request")
    logger.addHandler(caplog.handler)
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)


def assert_json_error(response, status):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["status"] == status and body["error"] and body["request_id"]
    assert response["X-Request-ID"] == body["request_id"]
    return body


def test_a_lone_surrogate_in_a_manifest_is_a_400_naming_the_field(client, token):
    body = assert_json_error(
        post_json(client, reverse("api-jobs"), '{"manifest": "name = \\"\\udcff\\""}', token), 400
    )
    assert body["error"].startswith("manifest: holds a lone surrogate")


def test_deeply_nested_json_is_a_400(client, token):
    text = '{"manifest": ' + "[" * 5000 + "]" * 5000 + "}"
    body = assert_json_error(post_json(client, reverse("api-jobs"), text, token), 400)
    assert "nested" in body["error"]


def test_a_5000_digit_integer_is_a_400(client, token):
    text = '{"manifest": "x", "generations": ' + "9" * 5000 + "}"
    body = assert_json_error(post_json(client, reverse("api-jobs"), text, token), 400)
    assert "digits" in body["error"]


def test_nan_is_a_400(client, token):
    text = '{"manifest": "x", "generations": NaN}'
    assert_json_error(post_json(client, reverse("api-jobs"), text, token), 400)


def test_a_body_over_the_limit_is_refused_by_its_length_before_it_is_read(client, token, settings):
    settings.API_MAX_BODY_BYTES = 2048
    response = post_json(client, reverse("api-jobs"), json.dumps({"manifest": "x" * 4096}), token)
    assert "limit is 2,048" in assert_json_error(response, 413)["error"]


def test_an_unknown_api_path_is_a_json_404_and_a_wrong_method_a_json_405(client, token):
    assert_json_error(client.get("/api/v1/nothing-here/", **token), 404)
    response = client.put(reverse("api-jobs"), b"{}", "application/json", **token)
    assert_json_error(response, 405)
    assert "GET" in response["Allow"]


def test_a_bad_content_length_is_a_json_400(client, token):
    response = client.generic(
        "POST", reverse("api-jobs"), b"{}", "application/json", CONTENT_LENGTH="x", **token
    )
    assert_json_error(response, 400)


def test_an_unhandled_exception_in_the_api_is_logged_and_answered_in_json(
    client, token, monkeypatch, caplog
):
    from portal.models import ApiToken

    def boom(*args, **kwargs):
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(ApiToken, "lookup", boom)
    with request_log(caplog):
        response = client.get(reverse("api-jobs"), **token)
    body = assert_json_error(response, 500)
    assert "disk" not in body["error"]  # no internals to the client
    records = [r for r in caplog.records if r.name == "django.request"]
    assert len(records) == 1  # once, with its traceback
    record = records[0]
    assert record.exc_info and "the disk is on fire" in str(record.exc_info[1])
    assert record.request.correlation_id == body["request_id"]


def test_a_server_error_page_names_the_correlation_id_and_the_traceback_is_logged(
    customer, monkeypatch, caplog
):
    from portal.web import views

    def boom(*args, **kwargs):
        raise RuntimeError("page exploded")

    client = Client(raise_request_exception=False)
    client.force_login(customer)
    monkeypatch.setattr(views, "render", boom)
    with request_log(caplog):
        response = client.get("/")
    assert response.status_code == 500
    rid = response["X-Request-ID"]
    assert rid and rid in response.content.decode()
    record = next(r for r in caplog.records if r.name == "django.request")
    assert "page exploded" in str(record.exc_info[1])
    assert record.correlation_id == rid or record.request.correlation_id == rid


def test_the_request_logger_writes_to_the_console_and_a_file():
    from django.conf import settings

    logger = settings.LOGGING["loggers"]["django.request"]
    assert "console" in logger["handlers"]
    assert settings.LOG_FILE and "file" in logger["handlers"]


def test_a_views_own_json_error_keeps_a_true_content_length(client, token):
    # Found by the CLI's tests: the status and request id were added to the body after
    # CommonMiddleware had set Content-Length, and clients read a truncated body.
    response = client.get("/api/v1/jobs/00000000-0000-0000-0000-000000000000/", **token)
    body = assert_json_error(response, 404)
    if response.has_header("Content-Length"):
        assert int(response["Content-Length"]) == len(response.content)
    assert body["error"]


def test_a_head_request_to_an_api_error_has_no_body_and_is_not_a_500(client, token):
    # Found by the fuzz suite: HEAD answers carry no body, so there is no JSON to read.
    response = client.head("/api/v1/nothing/", **token)
    assert response.status_code == 404 and response.content == b""
