"""Which web pages may use llamaswap: the Host it answers to, the cross-site requests it
refuses, and the origins its CORS headers name (``allowedHosts``, ``corsOrigins``).

llamaswap listens on ``127.0.0.1``, and every web page its user's browser opens can send
requests there. Being on loopback stops other machines, not other sites. A page has
three ways in, and each is closed here:

1. **DNS rebinding.** A page at ``http://evil.example:8080`` makes its own name resolve to
   ``127.0.0.1``; its requests then go to llamaswap *same-origin*, and the browser lets
   it read every answer. The request's ``Host`` still says ``evil.example:8080``, so
   llamaswap answers only to a Host that is its listen address, a loopback name
   (``localhost``, ``*.localhost``, which browsers resolve themselves), an IP address or
   a name in ``allowedHosts``. An IP address is always allowed: a rebinding page's Host
   is the name it rebinds, never an address, and with ``--listen 0.0.0.0`` the other
   machines reach llamaswap by this one's address. A request without Host (HTTP/1.0) is
   not a browser's. This is Ollama's CVE-2024-28224, fixed the same way, and Django's
   ``ALLOWED_HOSTS``.
2. **Requests that change state.** A form, or a ``fetch()`` that needs no CORS preflight
   (``text/plain``, form-encoded or multipart, no custom header), reaches the server
   whatever CORS says: CORS only stops the page *reading* the answer, and the unload has
   happened by then. A browser that has remembered the Basic-auth key sends it along. So
   a request that changes state is refused when its ``Origin`` is another site's (neither
   the request's own origin nor one ``corsOrigins`` allows), or, with no ``Origin``, when
   ``Sec-Fetch-Site`` says ``cross-site`` or ``same-site``; and a management route refuses
   the CORS-simple content types from any browser (a request with ``Origin`` or a
   ``Sec-Fetch-*`` field), so that no form post ever changes state. Clients that are not
   browsers (curl, the SDKs) send neither field and are not affected. Go's
   ``http.CrossOriginProtection`` and Django's CSRF origin check decide the same way.
3. **Reading the answers.** CORS headers let a listed page read. ``corsOrigins`` defaults
   to ``["*"]`` for llama-swap's sake, but ``"*"`` counts on the inference routes only
   (the OpenAI-style API, which browser chat UIs call); the management API (``/api/*``,
   ``/logs*``, ``/running``, ``/metrics``, ``/unload``, the dashboard) answers CORS only to
   origins listed by name.

Rejected: a token in the dashboard's requests (a CSRF token) would need state and a page
that fetched it first, for what the Origin check gives without either; refusing every
request that has an ``Origin`` would break the browser chat UIs llama-swap users run.
"""

from __future__ import annotations

import functools
import ipaddress

from hypercorn.typing import HTTPScope, WebsocketScope

from llamaswap.config.model import Config
from llamaswap.errors import CrossSiteRequest, HostNotAllowed, RequestError

__all__ = ["cors_origins", "is_inference", "refusal", "websocket_refusal"]

#: Methods that change nothing (a preflight is answered before any route).
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
#: llama-swap's ``GET /unload`` changes state (and HEAD runs the same view).
_UNSAFE_GET = frozenset({"/unload"})
#: The content types a page may send another site without a preflight (Fetch standard).
_SIMPLE = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
#: Quart's routes that belong to the OpenAI-style API (and Ollama's), with the proxied ones.
_OPEN = frozenset({"/health", "/v1/models", "/models", "/api/tags", "/api/ps", "/api/show"})
_OPEN_PREFIXES = ("/v1/models/", "/models/")
_DEFAULT_PORT = {"http": 80, "https": 443}
#: ``Sec-Fetch-Site`` values of a request the user or llamaswap's own page made.
_OWN = frozenset({b"same-origin", b"none"})


def is_inference(path: str, *, proxied: bool) -> bool:
    """Whether ``path`` is on the inference side (CORS ``"*"`` applies), not management."""
    return proxied or path in _OPEN or path.startswith(_OPEN_PREFIXES)


def cors_origins(config: Config, *, inference: bool) -> tuple[str, ...]:
    """The origins whose pages may read this route's answers: on the management routes,
    only those ``corsOrigins`` lists by name."""
    if inference:
        return config.cors_origins
    return _named(config.cors_origins)


@functools.lru_cache(maxsize=8)
def _named(origins: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(origin for origin in origins if origin != "*")


def refusal(
    scope: HTTPScope, config: Config, listen_hosts: tuple[str, ...], *, inference: bool
) -> RequestError | None:
    """Why llamaswap must not serve this request, or ``None``.

    ``listen_hosts``: the hosts of the addresses llamaswap listens on (a name there is
    one clients use). ``inference``: the route is on the inference side (:func:`is_inference`).
    """
    hosts: list[bytes] = []
    origin = fetch_site = content_type = None
    browser = False
    for name, value in scope["headers"]:  # one pass: every request comes through here
        name = name.lower()
        if name == b"host":
            hosts.append(value)
        elif name == b"origin":
            origin = value if origin is None else origin
        elif name.startswith(b"sec-fetch-"):
            browser = True
            if name == b"sec-fetch-site":
                fetch_site = value
        elif name == b"content-type":
            content_type = value
    if hosts and not _host_allowed(hosts, config.allowed_hosts, listen_hosts):
        return HostNotAllowed(b", ".join(hosts).decode("latin-1"))
    method, path = scope["method"], scope["path"]
    if method in _SAFE and (inference or path not in _UNSAFE_GET):
        return None
    if origin is None and not browser:
        return None  # not a browser: curl, an SDK, another server
    if inference and "*" in config.cors_origins:
        return None  # any page may: llama-swap's default
    if origin is not None:
        page = origin.decode("latin-1")
        key = _origin_key(page)
        own = key is not None and key == _own_origin(scope, hosts)
        if not own and key not in _listed(config.cors_origins):
            reason = f"it comes from a page at {page!r}, another site"
            return CrossSiteRequest(method, path, reason, _hint(inference))
    elif fetch_site is not None and fetch_site not in _OWN:
        site = fetch_site.decode("latin-1")
        reason = f"the browser says it comes from another site (Sec-Fetch-Site: {site})"
        return CrossSiteRequest(method, path, reason, _hint(inference))
    if not inference and content_type is not None:
        media_type = content_type.decode("latin-1").partition(";")[0].strip().lower()
        if media_type in _SIMPLE:
            reason = (
                f"a browser sent it as {media_type!r}, which a form or a fetch() "
                "without a CORS preflight can send from any site"
            )
            hint = "send no body, or a JSON one (Content-Type: application/json)"
            return CrossSiteRequest(method, path, reason, hint)
    return None


def websocket_refusal(
    scope: WebsocketScope, config: Config, listen_hosts: tuple[str, ...]
) -> RequestError | None:
    """Why llamaswap must not accept this WebSocket handshake, or ``None``: a ``Host`` it
    does not answer to, as for any request; and a page's handshake (it has an ``Origin``)
    from anywhere but llamaswap's own origin or one ``corsOrigins`` lists by name.
    Browsers apply no CORS to WebSockets, so any page could otherwise open one to a
    model server's UI and drive it (cross-site WebSocket hijacking): ``"*"`` does not
    count here."""
    hosts = [value for name, value in scope["headers"] if name.lower() == b"host"]
    if hosts and not _host_allowed(hosts, config.allowed_hosts, listen_hosts):
        return HostNotAllowed(b", ".join(hosts).decode("latin-1"))
    origin = next((value for name, value in scope["headers"] if name.lower() == b"origin"), None)
    if origin is None:
        return None  # not a browser
    page = origin.decode("latin-1")
    key = _origin_key(page)
    scheme = "https" if scope["scheme"] == "wss" else "http"
    own = len(hosts) == 1 and key == _origin_key(f"{scheme}://{hosts[0].decode('latin-1')}")
    if key is not None and (own or key in _listed(config.cors_origins)):
        return None
    reason = f"it comes from a page at {page!r}, another site"
    hint = "a page may open a WebSocket only from llamaswap's origin or one corsOrigins names"
    return CrossSiteRequest("WebSocket", scope["path"], reason, hint)


def _hint(inference: bool) -> str:
    if inference:
        return "if the page is yours, add its origin to corsOrigins"
    return (
        "a page may change llamaswap's state only from llamaswap's own origin or one that "
        'corsOrigins lists by name ("*" counts for the inference routes only); '
        "if the page is yours, add its origin to corsOrigins"
    )


def _host_allowed(
    hosts: list[bytes], allowed: tuple[str, ...], listen_hosts: tuple[str, ...]
) -> bool:
    if "*" in allowed:
        return True
    if len(hosts) != 1:
        return False  # RFC 9112 §3.2: exactly one
    return _one_host_allowed(hosts[0], allowed, listen_hosts)


@functools.lru_cache(maxsize=256)
def _one_host_allowed(
    host: bytes, allowed: tuple[str, ...], listen_hosts: tuple[str, ...]
) -> bool:
    """Whether ``host`` is a Host llamaswap answers to. Cached: clients send the same one
    on every request, and parsing an address is a few microseconds."""
    parsed = _authority(host.decode("latin-1"))
    if parsed is None:
        return False
    name = parsed[0]
    if name == "localhost" or name.endswith(".localhost") or _is_address(name):
        return True
    for entry in (*listen_hosts, *allowed):
        entry = _normal(entry)
        if entry == name or (entry.startswith("*.") and name.endswith(entry[1:])):
            return True
    return False


def _normal(name: str) -> str:
    """A host name as compared: lowercase, without the final dot of a fully-qualified one."""
    return name.lower().removesuffix(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _authority(text: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of ``host[:port]`` or ``[v6]:port``; ``None`` if it is neither."""
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = text.partition(":")
        if ":" in port:
            return None  # an IPv6 address without brackets
    if not name or (port and not port.isdigit()):
        return None
    return _normal(name), int(port) if port else None


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin (``http://localhost:3000``), default port
    filled in; ``None`` for ``null`` or anything not http(s)."""
    scheme, sep, rest = origin.lower().partition("://")
    if not sep or scheme not in _DEFAULT_PORT:
        return None
    parsed = _authority(rest.removesuffix("/"))
    if parsed is None:
        return None
    name, port = parsed
    return scheme, name, _DEFAULT_PORT[scheme] if port is None else port


def _own_origin(scope: HTTPScope, hosts: list[bytes]) -> tuple[str, str, int] | None:
    """The origin of the request's own URL: its scheme and its one Host."""
    if len(hosts) != 1:
        return None
    return _origin_key(f"{scope['scheme']}://{hosts[0].decode('latin-1')}")


@functools.lru_cache(maxsize=8)
def _listed(origins: tuple[str, ...]) -> frozenset[tuple[str, str, int]]:
    """The origins ``corsOrigins`` names (``"*"`` is not one)."""
    keys = (_origin_key(origin) for origin in origins if origin != "*")
    return frozenset(key for key in keys if key is not None)
