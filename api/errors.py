"""One error shape for every error of the API: problem details (RFC 9457).

``{"type", "title", "status", "detail", "errors"}``, served as ``application/problem+json``;
``errors`` maps each field (``non_field_errors`` for the whole body) to its messages. An
unexpected exception is a 500 of the same shape: logged with its traceback under a reference
the body gives, and nothing of the exception (message, traceback, settings) in the body."""

from __future__ import annotations

import logging
import uuid

from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

log = logging.getLogger(__name__)

PROBLEM_BASE = "/api/v1/problems/"
TITLES = {
    400: "Invalid request",
    401: "Not authenticated",
    403: "Not allowed",
    404: "Not found",
    405: "Method not allowed",
    406: "Not acceptable",
    409: "Conflict",
    415: "Unsupported media type",
    429: "Too many requests",
    500: "Server error",
}
SLUGS = {
    400: "invalid",
    401: "not-authenticated",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    406: "not-acceptable",
    409: "conflict",
    415: "unsupported-media-type",
    429: "throttled",
    500: "server-error",
}


class Conflict(exceptions.APIException):
    """The request is valid but the panel's state refuses it now (a busy deployment, a change
    in a state that does not allow the action)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


def problem(status_code: int, detail: str, errors: dict | None = None) -> dict:
    return {
        "type": PROBLEM_BASE + SLUGS.get(status_code, str(status_code)),
        "title": TITLES.get(status_code, "Error"),
        "status": status_code,
        "detail": detail,
        "errors": errors or {},
    }


def _flatten(data) -> list[str]:
    if isinstance(data, dict):
        return [m for v in data.values() for m in _flatten(v)]
    if isinstance(data, list):
        return [m for v in data for m in _flatten(v)]
    return [str(data)]


def problem_handler(exc, context):
    """DRF's handler, then its body rewritten as problem details."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = exception_handler(exc, context)
    if response is None:
        request = context.get("request")
        set_rollback()
        return internal_error(getattr(request, "path", ""), exc)
    data = response.data
    if isinstance(exc, exceptions.ValidationError):
        errors = data if isinstance(data, dict) else {"non_field_errors": _flatten(data)}
        errors = {k: _flatten(v) for k, v in errors.items()}
        messages = [
            f"{k}: {m}" if k != "non_field_errors" else m for k, v in errors.items() for m in v
        ]
        body = problem(response.status_code, "; ".join(messages) or "Invalid request.", errors)
    else:
        detail = data.get("detail") if isinstance(data, dict) else None
        body = problem(response.status_code, str(detail or exc))
    request = context.get("request")
    renderer = getattr(request, "accepted_renderer", None)
    # The browsable API (a person in a browser) gets its HTML page; clients get problem+json.
    as_json = renderer is None or getattr(renderer, "format", "json") == "json"
    kept = ("www-authenticate", "retry-after", "allow")
    return Response(
        body,
        status=response.status_code,
        headers={k: v for k, v in response.items() if k.lower() in kept},
        content_type="application/problem+json" if as_json else None,
    )


def internal_error(path: str, exc: BaseException | None = None) -> JsonResponse:
    """The 500 of an unexpected exception: logged (with its traceback, when there is one)
    under a reference that the body gives, so an operator can find it; the body says
    nothing else about it. Always JSON, never the browsable API's page: rendering that page
    is more code that could fail."""
    reference = uuid.uuid4().hex[:12]
    log.error(
        "API error %s on %s",
        reference,
        path,
        exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else False,
    )
    body = problem(500, f"An unexpected error occurred; it is logged as {reference}.")
    body["reference"] = reference
    return JsonResponse(body, status=500, content_type="application/problem+json")


def server_error(request, *args, **kwargs):
    """The project's ``handler500``: under ``/api/v1/`` (an error outside a DRF view's own
    handling, e.g. in a middleware; Django has logged its traceback) problem details too,
    elsewhere (the pages, ``/api/tokens/`` among them) Django's page."""
    if request.path.startswith("/api/v1/"):
        return internal_error(request.path)
    return defaults.server_error(request, *args, **kwargs)
