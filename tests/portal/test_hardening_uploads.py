"""Streaming upload limits: a large body is refused by its declared length before it is read, a
file part is cut off as its bytes pass the limit, and no temporary file is left on disk."""

import pytest
from django.core.exceptions import RequestDataTooBig
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from portal.upload_handlers import BoundedTemporaryFileUploadHandler

pytestmark = pytest.mark.django_db


@pytest.fixture
def small_limit(settings, tmp_path):
    settings.UPLOAD_MAX_BYTES = 4096
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path)
    return tmp_path


def test_a_page_upload_over_the_limit_is_refused_before_it_is_read(client, customer, small_limit):
    client.force_login(customer)
    big = SimpleUploadedFile("m.toml", b"x" * 10_000)
    response = client.post(reverse("web-upload"), {"mode": "manifest", "manifest_file": big})
    assert response.status_code == 413
    assert "limit is 4,096 bytes" in response.content.decode()
    assert list(small_limit.iterdir()) == []


def test_an_api_body_over_the_limit_is_a_json_413(client, customer, settings):
    settings.API_MAX_BODY_BYTES = 2048
    response = client.post(
        reverse("api-jobs"),
        {"f": SimpleUploadedFile("k.cu", b"x" * 10_000)},
        HTTP_AUTHORIZATION="x",
    )
    assert response.status_code == 413 and response.json()["status"] == 413


def test_a_streamed_file_part_is_cut_off_at_the_limit_and_leaves_nothing(small_limit):
    handler = BoundedTemporaryFileUploadHandler()
    handler.handle_raw_input(None, {}, None, b"boundary")  # no declared length: streamed
    handler.new_file("f", "big.bin", "application/octet-stream", None)
    assert list(small_limit.iterdir()) == []  # the temporary file has no name on disk
    handler.receive_data_chunk(b"x" * 4000, 0)
    with pytest.raises(RequestDataTooBig, match="larger than 4,096"):
        handler.receive_data_chunk(b"x" * 4000, 4000)
    assert handler.file.closed and list(small_limit.iterdir()) == []


def test_an_upload_within_the_limit_reaches_the_view_whole(small_limit):
    handler = BoundedTemporaryFileUploadHandler()
    handler.new_file("f", "k.cu", "text/plain", None)
    handler.receive_data_chunk(b"__global__ void k() {}\n", 0)
    uploaded = handler.file_complete(23)
    assert uploaded.read() == b"__global__ void k() {}\n" and uploaded.size == 23
    assert list(small_limit.iterdir()) == []
