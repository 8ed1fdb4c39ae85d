"""Request guards and the last-resort error handling.

`RequestGuardMiddleware` sits first in MIDDLEWARE:
- every request gets a correlation id (`request.correlation_id`, the `X-Request-ID` header of the
  answer, and `[id]` in every log line about it), so a customer who quotes it can be matched to
  the traceback in the log;
- under `/api/` a request body is bounded before any view parses it: its size
  (`API_MAX_BODY_BYTES`, 413), and for JSON its nesting depth (`API_MAX_JSON_DEPTH`), its
  integers (20 digits), NaN/Infinity and lone surrogates (400, naming the field);
- under `/api/` every error is answered in JSON, `{"error": message, "status": code,
  "request_id": id}`, never in HTML: exceptions of a view, and the 400/403/404/405/413/500 pages
  that Django or another middleware would answer in HTML;
- every answer carries the Content-Security-Policy of settings.CONTENT_SECURITY_POLICY;
- an exception no view handled is logged with its traceback by the `django.request` logger
  (console and file, see settings.LOGGING) and answered with the correlation id: JSON under
  `/api/`, the small HTML page of `server_error` elsewhere.
"""

from __future__ import annotations

import json
import logging
import uuid

from django.conf import settings
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
)
from django.http import (
    Http404,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseServerError,
    JsonResponse,
)
from django.utils.html import escape

from portal import results_schema

log = logging.getLogger("django.request")

API_PREFIX = "/api/"
JSON_METHODS = ("POST", "PUT", "PATCH", "DELETE")

MESSAGES = {
    400: "Bad request.",
    401: "Not authenticated.",
    403: "Forbidden.",
    404: "Not found.",
    405: "Method not allowed.",
    413: "The request body is too large.",
    429: "Too many requests.",
    500: "Internal error. Quote the request id when you report it.",
}


def new_correlation_id() -> str:
    return uuid.uuid4().hex[:16]


def json_error(request, status: int, message: str | None = None) -> JsonResponse:
    return JsonResponse(
        {
            "error": message or MESSAGES.get(status, "Error."),
            "status": status,
            "request_id": getattr(request, "correlation_id", ""),
        },
        status=status,
    )


def _is_json(response) -> bool:
    return response.get("Content-Type", "").split(";")[0].strip() == "application/json"


def _surrogate_path(value, path: str = "") -> str | None:
    """Where a string in parsed JSON holds a lone surrogate (not encodable as UTF-8), or None."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                key_path = f"{where}.{key}" if where else str(key)
                stack.append((key, f"{key_path} (the key)"))
                stack.append((child, key_path))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


class RequestGuardMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.correlation_id = new_correlation_id()
        if request.path_info.startswith(API_PREFIX):
            response = self._refuse_body(request) or self.get_response(request)
            response = self._as_json(request, response)
        else:
            response = self._refuse_large(request) or self.get_response(request)
        response["X-Request-ID"] = request.correlation_id
        if settings.CONTENT_SECURITY_POLICY and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = settings.CONTENT_SECURITY_POLICY
        return response

    # -- before the view ------------------------------------------------------------------------

    def _refuse_body(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return json_error(request, 400, "The Content-Length header is not a number.")
        limit = settings.API_MAX_BODY_BYTES
        if length > limit:
            return json_error(
                request, 413, f"The request body is {length:,} bytes; the limit is {limit:,}."
            )
        if request.method not in JSON_METHODS or request.content_type != "application/json":
            return None
        try:
            body = request.body  # read once here (bounded above); Django keeps it for the view
        except RequestDataTooBig:
            return json_error(request, 413)
        if not body.strip():
            return None
        try:
            parsed = results_schema.loads(
                body, max_depth=settings.API_MAX_JSON_DEPTH, allow_nan=False
            )
        except results_schema.SchemaError as exc:
            return json_error(request, 400, f"The request body is not acceptable JSON: {exc}")
        where = _surrogate_path(parsed)
        if where:
            return json_error(
                request, 400, f"{where}: holds a lone surrogate (not valid Unicode text)"
            )
        return None

    def _refuse_large(self, request):
        """A page's request body over UPLOAD_MAX_BYTES, by its declared length: 413 before any
        byte of it is read (a streamed body without a length is capped by the upload handler)."""
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return HttpResponseBadRequest("Bad Content-Length.", content_type="text/plain")
        limit = settings.UPLOAD_MAX_BYTES
        if length > limit:
            return HttpResponse(
                f"The upload is {length:,} bytes; the limit is {limit:,} bytes.",
                status=413,
                content_type="text/plain; charset=utf-8",
            )
        return None

    # -- a view that raised ---------------------------------------------------------------------

    def process_exception(self, request, exception):
        if not request.path_info.startswith(API_PREFIX):
            if isinstance(exception, RequestDataTooBig):  # a page's upload, streamed too far
                return HttpResponse(str(exception), status=413, content_type="text/plain")
            return None  # Django answers (and logs) it; handler500 shows the correlation id
        if isinstance(exception, Http404):
            return json_error(request, 404)
        if isinstance(exception, PermissionDenied):
            return json_error(request, 403, str(exception) or None)
        if isinstance(exception, RequestDataTooBig):
            return json_error(request, 413)
        if isinstance(exception, TooManyFieldsSent | SuspiciousOperation | BadRequest):
            return json_error(request, 400, str(exception) or None)
        if isinstance(exception, UnicodeError | RecursionError):
            # Text a guard above did not catch (a form field, a header): the request's fault.
            log.warning(
                "Bad request: %s",
                request.path,
                exc_info=exception,
                extra={"status_code": 400, "request": request},
            )
            return json_error(request, 400, f"The request holds text it cannot: {exception}")
        log.error(
            "Internal Server Error: %s",
            request.path,
            exc_info=exception,
            extra={"status_code": 500, "request": request},
        )
        response = json_error(request, 500)
        response._has_been_logged = True  # with its traceback, just above: not twice
        return response

    # -- after: no HTML from the API -------------------------------------------------------------

    def _as_json(self, request, response):
        if response.status_code < 400:
            return response
        if _is_json(response):
            return self._with_status(request, response)
        replaced = json_error(request, response.status_code)
        if response.has_header("Allow"):
            replaced["Allow"] = response["Allow"]
        if response.has_header("Retry-After"):
            replaced["Retry-After"] = response["Retry-After"]
        return replaced

    def _with_status(self, request, response):
        """A view's own JSON error ({"error": ...}) gains its status and the request id."""
        if getattr(response, "streaming", False) or len(response.content) > 64 * 1024:
            return response
        try:
            body = json.loads(response.content)
        except ValueError:
            return response
        if isinstance(body, dict) and "error" in body:
            body.setdefault("status", response.status_code)
            body.setdefault("request_id", request.correlation_id)
            response.content = json.dumps(body)
            if response.has_header("Content-Length"):  # set by CommonMiddleware, inside us
                response["Content-Length"] = str(len(response.content))
        return response


class CorrelationIdFilter(logging.Filter):
    """Adds `correlation_id` to every log record (the request's, where the record has one)."""

    def filter(self, record):
        request = getattr(record, "request", None)
        record.correlation_id = getattr(request, "correlation_id", "-")
        return True


def server_error(request, *args, **kwargs):
    """handler500: a page that names the correlation id, rendered without templates or the
    database (either may be what failed)."""
    rid = escape(getattr(request, "correlation_id", "") or "")
    if request.path_info.startswith(API_PREFIX):
        return json_error(request, 500)
    static = escape(settings.STATIC_URL or "/static/")  # plain files: no template, no database
    html = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Server error</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<link rel='stylesheet' href='{static}css/portal.css'>"
        f"<link rel='icon' href='{static}favicon.svg' type='image/svg+xml'></head><body>"
        "<header class='topbar'><a class='brand' href='/'><span class='mark'>PTX</span> Kernel "
        "Factory</a></header><main><div class='card' id='server-error'><h1>Server error</h1>"
        "<p>Something went wrong on our side. It has been "
        f"logged; quote request id <code>{rid}</code> if you report it.</p>"
        "<p><a href='/'>Back to your home page</a></p></div></main></body></html>"
    )
    return HttpResponseServerError(html)
