"""The proxied routes: which paths are forwarded, with which methods, and where each
names its model (SPEC §4.1)."""

from __future__ import annotations

import attrs
from hypercorn.typing import HTTPScope

from .extract import ModelIn

__all__ = ["INFERENCE", "METHODS", "UPSTREAM_PREFIX", "Route", "route"]

UPSTREAM_PREFIX = "/upstream/"

_J, _M, _Q = ModelIn.JSON, ModelIn.MULTIPART, ModelIn.QUERY
INFERENCE: dict[tuple[str, str], ModelIn] = {
    **{
        ("POST", path): _J
        for path in (
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/embeddings",
            "/v1/rerank",
            "/v1/reranking",
            "/rerank",
            "/reranking",
            "/infill",
            "/completion",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/audio/speech",
            "/v1/images/generations",
        )
    },
    ("POST", "/v1/audio/transcriptions"): _M,
    ("POST", "/v1/images/edits"): _M,
    ("GET", "/v1/audio/voices"): _Q,
    ("GET", "/props"): _Q,
}

#: The methods each inference path answers to, for a JSON 405 on the others. A GET path
#: answers HEAD too, forwarded as it came.
METHODS = {path: "GET, HEAD" if method == "GET" else method for method, path in INFERENCE}


@attrs.frozen
class Route:
    """How a proxied route names its model: in the body/query, or in the path."""

    model_in: ModelIn | None  # None: /upstream/{model}/{path}
    wrong_method: bool = False


# Made once, looked up by every request (a frozen attrs value is slow to build: each field
# goes through object.__setattr__).
_ROUTES = {key: Route(model_in) for key, model_in in INFERENCE.items()}
_UPSTREAM_ROUTE = Route(None)
_WRONG_METHOD = Route(None, wrong_method=True)


def route(scope: HTTPScope) -> Route | None:
    """The route ``scope`` asks for, or ``None`` if this is not a proxied route."""
    if scope["path"].startswith(UPSTREAM_PREFIX):
        return _UPSTREAM_ROUTE
    method = "GET" if scope["method"] == "HEAD" else scope["method"]
    found = _ROUTES.get((method, scope["path"]))
    if found is not None:
        return found
    return _WRONG_METHOD if scope["path"] in METHODS else None
