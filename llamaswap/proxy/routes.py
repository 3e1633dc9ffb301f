"""The proxied routes: which paths are forwarded, with which methods, and where each
names its model (SPEC §4.1)."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote_to_bytes

import attrs
from hypercorn.typing import HTTPScope, WebsocketScope

from llamaswap.errors import BadRequest
from llamaswap.router.names import Local, Names, Peer

from .extract import ModelIn

__all__ = [
    "COMFYUI_MODEL",
    "INFERENCE",
    "METHODS",
    "UPSTREAM_PREFIX",
    "Route",
    "passthrough",
    "route",
    "slash_location",
    "upstream_target",
]

UPSTREAM_PREFIX = "/upstream/"
#: ``/comfyui/{path}``: ``/upstream/comfyui_auto/{path}``, as llama-swap serves ComfyUI.
COMFYUI_PREFIX = "/comfyui"
COMFYUI_MODEL = "comfyui_auto"
#: Prefixes of routes forwarded without them.
VERSIONLESS_PREFIX = "/v"
AUDIOAPI_PREFIX = "/audioapi"
#: What may stay unescaped in a forwarded path (RFC 3986 pchar and "/").
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_HEX = re.compile(rb"[0-9A-Fa-f]{2}")

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
            # llama-server serves the OpenAI routes without /v1 too, and its own.
            "/chat/completions",
            "/completions",
            "/responses",
            "/embeddings",
            "/embedding",
            "/tokenize",
            "/detokenize",
            "/apply-template",
            # llama-server's prompt token counts, for a chat or a Responses request
            "/chat/completions/input_tokens",
            "/v1/chat/completions/input_tokens",
            "/responses/input_tokens",
            "/v1/responses/input_tokens",
            # image servers (stable-diffusion.cpp, the AUTOMATIC1111 API)
            "/sdapi/v1/txt2img",
            "/sdapi/v1/img2img",
            # audio.cpp's task API, forwarded without /audioapi
            f"{AUDIOAPI_PREFIX}/v1/tasks/run",
            # Ollama's API (proxy/ollama.py)
            "/api/chat",
            "/api/generate",
            "/api/embed",
            "/api/embeddings",
        )
    },
    # llama-swap's versionless routes, forwarded without /v (/v/chat/completions goes to
    # the model server as /chat/completions).
    **{
        ("POST", f"{VERSIONLESS_PREFIX}/{path}"): _J
        for path in (
            "chat/completions",
            "responses",
            "completions",
            "messages",
            "messages/count_tokens",
            "embeddings",
            "rerank",
            "reranking",
        )
    },
    ("POST", "/v1/audio/transcriptions"): _M,
    ("POST", "/audio/transcriptions"): _M,  # llama-server's, without /v1
    ("POST", "/v1/images/edits"): _M,
    ("GET", "/v1/audio/voices"): _Q,
    # llama.cpp's routes whose body (if any) names no model: ?model=NAME, or the default.
    ("GET", "/props"): _Q,
    ("POST", "/props"): _Q,
    ("GET", "/slots"): _Q,
    ("GET", "/lora-adapters"): _Q,
    ("POST", "/lora-adapters"): _Q,
    ("GET", "/tools"): _Q,
    ("POST", "/tools"): _Q,
    ("GET", "/sdapi/v1/loras"): _Q,
}


#: The methods each inference path answers to, for a JSON 405 on the others. A GET path
#: answers HEAD too, forwarded as it came.
def _allowed_methods() -> dict[str, str]:
    allowed: dict[str, list[str]] = {}
    for method, path in INFERENCE:
        allowed.setdefault(path, []).append("GET, HEAD" if method == "GET" else method)
    return {path: ", ".join(methods) for path, methods in allowed.items()}


METHODS = _allowed_methods()


@attrs.frozen
class Route:
    """How a proxied route names its model: in the body/query, or in the path."""

    model_in: ModelIn | None  # None: /upstream/{model}/{path}, or /comfyui/{path}
    wrong_method: bool = False
    #: The prefix the path goes to the model server without (``/v``, ``/audioapi``).
    strip: str = ""
    #: ``/comfyui``: the one model it reaches, which only ``/comfyui/`` itself may load.
    comfyui: bool = False


def _strip(path: str) -> str:
    for prefix in (f"{VERSIONLESS_PREFIX}/", f"{AUDIOAPI_PREFIX}/"):
        if path.startswith(prefix):
            return prefix[:-1]
    return ""


# Made once, looked up by every request (a frozen attrs value is slow to build: each field
# goes through object.__setattr__).
_ROUTES = {key: Route(model_in, strip=_strip(key[1])) for key, model_in in INFERENCE.items()}
_UPSTREAM_ROUTE = Route(None)
_COMFYUI_ROUTE = Route(None, comfyui=True)
_WRONG_METHOD = Route(None, wrong_method=True)


def passthrough(path: str) -> Route | None:
    """The route of ``/upstream/{model}/{path}`` or ``/comfyui/{path}``; None for any other
    path (the routes a WebSocket may take)."""
    if path.startswith(UPSTREAM_PREFIX):
        return _UPSTREAM_ROUTE
    if path == COMFYUI_PREFIX or path.startswith(f"{COMFYUI_PREFIX}/"):
        return _COMFYUI_ROUTE
    return None


def route(scope: HTTPScope) -> Route | None:
    """The route ``scope`` asks for, or ``None`` if this is not a proxied route."""
    path = scope["path"]
    through = passthrough(path)
    if through is not None:
        return through
    method = "GET" if scope["method"] == "HEAD" else scope["method"]
    found = _ROUTES.get((method, scope["path"]))
    if found is not None:
        return found
    return _WRONG_METHOD if scope["path"] in METHODS else None


def upstream_target(
    scope: HTTPScope | WebsocketScope, names: Names, *, comfyui: bool = False
) -> tuple[str, Local | Peer, str | None]:
    """What ``/upstream/{model}{rest}`` (or ``/comfyui{rest}``, for ``comfyui_auto``) asks
    for: the name in the path, the model it names, and ``rest`` as the client escaped it;
    None for ``rest`` when it is empty (``/upstream/{model}``: answered with a redirect to
    ``slash_location``).

    Raises:
        ModelNotFound: no model by that name.
        BadRequest: ``rest`` has dot segments.
    """
    if comfyui:
        name = COMFYUI_MODEL
        target, path = names.upstream(name), scope["path"][len(COMFYUI_PREFIX) :] or "/"
    else:
        name, _, rest = scope["path"][len(UPSTREAM_PREFIX) :].partition("/")
        target, path = names.resolve_path(name, rest)
    _refuse_dot_segments(scope["path"], path)
    if path == "/" and not scope["path"].endswith("/"):
        return name, target, None
    return name, target, _as_escaped(scope, path)


def slash_location(scope: HTTPScope) -> bytes:
    """``/upstream/{model}`` → ``/upstream/{model}/``, as llama-swap answers: relative links
    in the model server's own pages then resolve under it."""
    location = quote(scope["path"], safe=_PATH_SAFE) + "/"
    if scope["query_string"]:
        location += "?" + scope["query_string"].decode("latin-1")
    return location.encode("latin-1")


def _refuse_dot_segments(full: str, rest: str) -> None:
    """Raises BadRequest if ``rest``, the decoded path after ``/upstream/{model}``, has a
    ``.`` or ``..`` segment (RFC 3986 §5.2.4; ``%2e`` decodes to ``.``, and a ``%2F``
    inside a segment is taken as the ``/`` a server may decode it to).

    A model server resolves them: ``/upstream/m/../../x`` would ask it for ``/x``, and a
    peer's server for what lies outside its ``proxy`` path. Browsers resolve them before
    sending, so only a client that means it sends one: refusing is clearer than
    resolving."""
    for segment in rest.split("/"):
        if segment in (".", ".."):
            model = full[: len(full) - len(rest)]
            raise BadRequest(
                f"the path after {model!r} has a {segment!r} segment (RFC 3986 dot "
                "segments, %2E included): llamaswap does not pass them to the model server; "
                "send the path with them resolved"
            )


def _as_escaped(scope: HTTPScope | WebsocketScope, rest: str) -> str:
    """``rest``, the decoded end of an ``/upstream/{model}{rest}`` path, as the client
    escaped it (``a%2Fb`` stays one segment), found by walking the raw path past the part
    that decodes to ``/upstream/{model}``; re-escaped from ``rest`` if they do not line up."""
    raw: bytes = scope["raw_path"]
    head = scope["path"][: len(scope["path"]) - len(rest)].encode()
    index = decoded = 0
    while decoded < len(head) and index < len(raw):
        index += 3 if raw[index] == 0x25 and _HEX.fullmatch(raw[index + 1 : index + 3]) else 1
        decoded += 1
    if unquote_to_bytes(raw[:index]) != head or raw[index : index + 1] != b"/":
        return quote(rest, safe=_PATH_SAFE)
    return quote(raw[index:].decode("latin-1"), safe=_PATH_SAFE + "%")
