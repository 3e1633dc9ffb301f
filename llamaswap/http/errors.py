"""One table from error class to HTTP status and OpenAI-style body (SPEC §4.3)."""

from __future__ import annotations

import json
from typing import Any

from llamaswap.errors import (
    BadRequest,
    BodyTooLarge,
    ConcurrencyLimit,
    CrossSiteRequest,
    HeadTooLarge,
    HostNotAllowed,
    InternalError,
    MethodNotAllowed,
    ModelNotFound,
    ModelNotLoaded,
    ModelStartFailed,
    ModelUnloaded,
    NotFound,
    QueueFull,
    RequestCancelled,
    RequestError,
    RequestTimeout,
    ShuttingDown,
    Unauthorized,
    UpstreamError,
)

__all__ = ["error_answer", "error_response"]

# class → (status, OpenAI error type, code, extra headers)
_TABLE: dict[type[RequestError], tuple[int, str, str, tuple[tuple[str, str], ...]]] = {
    BadRequest: (400, "invalid_request_error", "invalid_request", ()),
    Unauthorized: (
        401,
        "authentication_error",
        "invalid_api_key",
        (("www-authenticate", 'Basic realm="llamaswap"'),),
    ),
    HostNotAllowed: (403, "permission_error", "host_not_allowed", ()),
    CrossSiteRequest: (403, "permission_error", "cross_site_request", ()),
    ModelNotFound: (404, "invalid_request_error", "model_not_found", ()),
    NotFound: (404, "invalid_request_error", "not_found", ()),
    MethodNotAllowed: (405, "invalid_request_error", "method_not_allowed", ()),
    RequestTimeout: (408, "invalid_request_error", "request_timeout", ()),
    BodyTooLarge: (413, "invalid_request_error", "request_too_large", ()),
    HeadTooLarge: (431, "invalid_request_error", "request_head_too_large", ()),
    ConcurrencyLimit: (429, "rate_limit_error", "concurrency_limit", (("retry-after", "1"),)),
    QueueFull: (429, "rate_limit_error", "queue_full", (("retry-after", "1"),)),
    # 499 (nginx's "client closed request", gRPC's CANCELLED): a 4xx, so client SDKs do
    # not send the request again on their own, as they would after a 503.
    RequestCancelled: (499, "server_error", "request_cancelled", ()),
    ModelStartFailed: (502, "server_error", "model_start_failed", ()),
    UpstreamError: (502, "server_error", "upstream_error", ()),
    ModelUnloaded: (503, "server_error", "model_unloaded", ()),
    ModelNotLoaded: (503, "server_error", "model_not_loaded", ()),
    ShuttingDown: (503, "server_error", "shutting_down", ()),
    InternalError: (500, "server_error", "internal_error", ()),
    RequestError: (500, "server_error", "internal_error", ()),  # any class not above
}


def error_response(
    error: RequestError, *, message_only: bool = False
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and JSON body for ``error``; ``message_only``: the body is
    ``{"error": MESSAGE}``, as Ollama's API has it (its clients read a string there)."""
    # The nearest class in the table: a subclass answers like its parent.
    row = next(_TABLE[cls] for cls in type(error).__mro__ if cls in _TABLE)
    status, kind, code, extra = row
    if isinstance(error, MethodNotAllowed):
        extra = (("allow", error.allowed),)
    elif isinstance(error, ConcurrencyLimit | QueueFull) and error.retry_after is not None:
        extra = (("retry-after", str(error.retry_after)),)  # estimated (resources/eta.py)
    param = error.param if isinstance(error, BadRequest) else None
    body: dict[str, Any] = {
        "error": {"message": str(error), "type": kind, "code": code, "param": param}
    }
    if message_only:
        body = {"error": str(error)}
    headers = [("content-type", "application/json"), *extra]
    return status, headers, json.dumps(body).encode()


def error_answer(
    error: RequestError, *, close: bool = False, message_only: bool = False
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """``error_response`` as the answer goes on the wire: the fields as bytes, with the
    body's Content-Length, and ``Connection: close`` when ``close`` (the rest of the
    request may still come); ``message_only``: as ``error_response``."""
    status, headers, body = error_response(error, message_only=message_only)
    fields = [(name.encode(), value.encode()) for name, value in headers]
    fields.append((b"content-length", str(len(body)).encode()))
    if close:
        fields.append((b"connection", b"close"))
    return status, fields, body
