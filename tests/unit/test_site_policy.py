"""proxy/site.py as a pure function of a request's scope and the config: which Host is
served, which browser request may change state, which origins CORS names."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypercorn.typing import ConnectionState, HTTPScope

from llamaswap.config import loads_config
from llamaswap.config.model import Config
from llamaswap.errors import CrossSiteRequest, HostNotAllowed
from llamaswap.proxy import cors, site
from tests.unit.ports import every_port_free
from tests.unit.test_config_keys import problems_of

DEFAULTS = Config()


def scope(
    method: str, path: str, headers: Sequence[tuple[str, str]], *, scheme: str = "http"
) -> HTTPScope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "extensions": {},
        "state": ConnectionState({}),
    }


def refused(
    headers: Sequence[tuple[str, str]],
    *,
    method: str = "GET",
    path: str = "/running",
    config: Config = DEFAULTS,
    listen_host: str | None = "127.0.0.1",
    scheme: str = "http",
) -> type[Exception] | None:
    inference = site.is_inference(path, proxied=path.startswith(("/v1/chat", "/upstream/")))
    error = site.refusal(
        scope(method, path, headers, scheme=scheme),
        config,
        () if listen_host is None else (listen_host,),
        inference=inference,
    )
    return None if error is None else type(error)


@pytest.mark.parametrize(
    ("host", "allowed_hosts", "listen_host", "served"),
    [
        ("127.0.0.1:8080", (), "127.0.0.1", True),
        ("127.0.0.2", (), "127.0.0.1", True),  # any IP address
        ("[::1]:8080", (), "127.0.0.1", True),
        ("[fe80::1]", (), "127.0.0.1", True),
        ("localhost", (), "127.0.0.1", True),
        ("LOCALHOST.:8080", (), "127.0.0.1", True),
        ("chat.localhost", (), "127.0.0.1", True),
        ("localhost.evil.example", (), "127.0.0.1", False),
        ("127.0.0.1.nip.io", (), "127.0.0.1", False),  # a name that resolves to loopback
        ("gpu-box", (), "gpu-box", True),  # the listen address's name
        ("gpu-box:8080", (), "GPU-BOX", True),
        ("gpu-box", (), "0.0.0.0", False),
        ("gpu-box.lan", ("gpu-box.lan",), None, True),
        ("a.example.org", ("*.example.org",), None, True),
        ("example.org", ("*.example.org",), None, False),
        ("evil.example", ("*",), None, True),
        ("evil.example", (), None, False),
        ("::1", (), None, False),  # an IPv6 address without its brackets
        ("localhost:http", (), None, False),
        ("[::1", (), None, False),
        ("", (), None, False),
    ],
)
def test_the_hosts_llamaswap_answers_to(
    host: str, allowed_hosts: tuple[str, ...], listen_host: str | None, served: bool
) -> None:
    config = Config(allowed_hosts=allowed_hosts)
    outcome = refused([("Host", host)], config=config, listen_host=listen_host)
    assert outcome is (None if served else HostNotAllowed)


def test_no_host_is_served_and_two_are_not() -> None:
    assert refused([]) is None  # HTTP/1.0: not a browser's
    assert refused([("Host", "localhost"), ("Host", "evil.example")]) is HostNotAllowed


OWN = ("Host", "127.0.0.1:8080")


@pytest.mark.parametrize(
    ("headers", "outcome"),
    [
        ([OWN], None),  # curl
        ([OWN, ("Content-Type", "application/x-www-form-urlencoded")], None),  # curl -d
        ([OWN, ("Origin", "http://127.0.0.1:8080")], None),  # the dashboard
        ([("Host", "localhost"), ("Origin", "http://localhost:80")], None),  # default port
        ([("Host", "localhost:80"), ("Origin", "http://LOCALHOST")], None),
        ([OWN, ("Origin", "https://127.0.0.1:8080")], CrossSiteRequest),  # another scheme
        ([OWN, ("Origin", "http://127.0.0.1:8081")], CrossSiteRequest),
        ([OWN, ("Origin", "http://evil.example")], CrossSiteRequest),
        ([OWN, ("Origin", "null")], CrossSiteRequest),
        ([("Origin", "null")], CrossSiteRequest),  # no Host: no own origin either
        ([OWN, ("Sec-Fetch-Site", "same-origin")], None),
        ([OWN, ("Sec-Fetch-Site", "none")], None),
        ([OWN, ("Sec-Fetch-Site", "same-site")], CrossSiteRequest),
        ([OWN, ("Sec-Fetch-Site", "cross-site")], CrossSiteRequest),
        (
            [OWN, ("Origin", "http://127.0.0.1:8080"), ("Content-Type", "text/plain")],
            CrossSiteRequest,
        ),
        (
            [OWN, ("Sec-Fetch-Mode", "navigate"), ("Content-Type", "Text/Plain; x=1")],
            CrossSiteRequest,
        ),
        ([OWN, ("Origin", "http://127.0.0.1:8080"), ("Content-Type", "application/json")], None),
    ],
)
def test_who_may_change_state(
    headers: list[tuple[str, str]], outcome: type[Exception] | None
) -> None:
    assert refused(headers, method="POST", path="/api/models/unload") is outcome
    assert refused(headers, method="GET", path="/unload") is outcome
    assert refused(headers, method="GET", path="/api/activity") is None  # reads change nothing


def test_a_listed_origin_may_change_state_and_star_only_on_inference_routes() -> None:
    page = [OWN, ("Origin", "http://app.local")]
    listed = Config(cors_origins=("http://app.local/",))  # the trailing slash is allowed
    assert refused(page, method="POST", path="/api/models/unload", config=listed) is None
    star = Config(cors_origins=("*",))
    assert refused(page, method="POST", path="/api/models/unload", config=star) is (
        CrossSiteRequest
    )
    assert refused(page, method="POST", path="/v1/chat/completions", config=star) is None
    # multipart from a chat UI (audio uploads) is fine on the inference routes
    upload = [*page, ("Content-Type", "multipart/form-data; boundary=b")]
    assert refused(upload, method="POST", path="/v1/chat/completions", config=listed) is None
    other = [OWN, ("Origin", "http://evil.example")]
    assert refused(other, method="POST", path="/v1/chat/completions", config=listed) is (
        CrossSiteRequest
    )
    assert refused(other, method="POST", path="/upstream/m/x", config=Config(cors_origins=()))
    assert refused(other, method="GET", path="/upstream/m/", config=listed) is None


def test_cors_origins_of_the_management_routes_are_the_named_ones() -> None:
    config = Config(cors_origins=("*", "http://app.local"))
    assert site.cors_origins(config, inference=True) == ("*", "http://app.local")
    assert site.cors_origins(config, inference=False) == ("http://app.local",)
    assert site.cors_origins(Config(), inference=False) == ()
    for path in ("/v1/models", "/models", "/v1/models/a/b", "/health"):
        assert site.is_inference(path, proxied=False)
    for path in ("/api/activity", "/logs", "/running", "/metrics", "/unload", "/ui/", "/"):
        assert not site.is_inference(path, proxied=False)


def test_a_listed_origin_with_a_trailing_slash_is_named_in_cors_headers() -> None:
    """The config accepts ``"http://app.local/"``; the browser sends ``http://app.local``."""
    assert cors.allow_origin(("http://App.local/",), b"http://app.local") == b"http://app.local"
    assert cors.allow_origin(("http://app.local",), b"http://app.local.evil") is None


def test_allowed_hosts_entries_are_host_names() -> None:
    found = problems_of(
        """
        allowedHosts = [
            "gpu-box.lan", "*.example.org", "*", "[::1]",
            "http://gpu-box", "gpu-box:8080", "a/b", "",
        ]
        """
    )
    expected = (
        'expected a host name like "gpu-box.lan" (no scheme, port or path), "*.example.org" '
        'for the names under it, or "*", got '
    )
    assert found == {
        "allowedHosts[4]": expected + "'http://gpu-box'",
        "allowedHosts[5]": expected + "'gpu-box:8080'",
        "allowedHosts[6]": expected + "'a/b'",
        "allowedHosts[7]": expected + "''",
    }
    config = loads_config(
        'allowedHosts = ["gpu-box.lan"]\n[models.m]\ncmd = "x ${PORT}"\n', free=every_port_free
    )
    assert config.allowed_hosts == ("gpu-box.lan",)
    assert Config().allowed_hosts == ()


# ---------------------------------------------------------------- never widened

UPSTREAM = (b"x-llamaswap-upstream", b"alpha")
PAGE = b"http://app.local"


def allow_origin_of(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [v for k, v in headers if k == b"access-control-allow-origin"]


@pytest.mark.parametrize(
    ("theirs", "allowed", "expected"),
    [
        (None, b"*", []),  # a model server without CORS: nothing added
        (None, PAGE, []),
        (PAGE, b"*", [PAGE]),  # its own answer stands
        (PAGE, PAGE, [PAGE]),
        (b"http://other", b"*", [b"http://other"]),  # the browser refuses: as it said
        (b"*", b"*", [b"*"]),
        (b"*", PAGE, [PAGE]),  # narrowed to the page corsOrigins names
        (PAGE, None, []),  # corsOrigins refuses the page: taken out
        (b"*", None, []),
    ],
)
def test_a_model_servers_cors_answer_is_never_widened(
    theirs: bytes | None, allowed: bytes | None, expected: list[bytes]
) -> None:
    headers = [(b"content-type", b"application/json"), UPSTREAM]
    if theirs is not None:
        headers += [(b"access-control-allow-origin", theirs)]
        headers += [(b"access-control-allow-credentials", b"true")]
    result = cors.narrowed(headers, allowed)
    assert allow_origin_of(result) == expected
    kept = theirs is not None and expected == [theirs]
    credentials = (b"access-control-allow-credentials", b"true") in result
    assert credentials == kept  # taken out with a changed or removed origin
    assert UPSTREAM in result
    assert (b"content-type", b"application/json") in result


@pytest.mark.parametrize("allowed", [b"*", PAGE, None])
def test_llamaswaps_own_answers_name_what_cors_origins_allows(allowed: bytes | None) -> None:
    # An answer without X-LlamaSwap-Upstream is llamaswap's: a stray field is replaced.
    headers = [(b"content-type", b"application/json"), (b"access-control-allow-origin", b"*")]
    result = cors.narrowed(headers, allowed)
    assert allow_origin_of(result) == ([] if allowed is None else [allowed])
