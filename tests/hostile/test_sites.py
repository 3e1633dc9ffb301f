"""Hostile web pages: what a page on another site, in the browser of someone on this
machine, can make llamaswap do. Each test runs the real proxy (and the fake model server)
on 127.0.0.1 and sends what such a page's browser would send, over a raw socket (h11 on
the client side: no client library drops a second field or fixes the ``Host``), or drives
a real Chromium.

**A foreign Host gets nothing; a cross-site or form-like request changes nothing; the
management API's answers are readable only by origins listed by name.** The policy is
``llamaswap/proxy/site.py``'s.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import socket
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, final

import attrs
import h11
import httpx
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import running
from tests.e2e.test_proxy import chat, config

with contextlib.suppress(ImportError):  # without it the browser test skips, saying why
    from playwright.sync_api import sync_playwright

TWO = """
[models.alpha]
cmd = "${fake}"
[models.beta]
cmd = "${fake}"
"""
EVIL = "http://evil.example"
#: A value for ``host=`` that sends no Host field at all.
NO_HOST = ""


@final
@attrs.frozen
class Answer:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.headers.get(name)
        return None if values is None else ", ".join(values)

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


def authority(url: str) -> str:
    return url.removeprefix("http://")


def own_origin(url: str) -> str:
    return url


async def ask(
    url: str,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    host: str | None = None,
    http_version: str = "1.1",
) -> Answer:
    """One request over its own connection, exactly as given. ``host``: the Host field's
    value (by default the proxy's own address; ``NO_HOST``: none)."""
    host = authority(url) if host is None else host
    fields = [("Host", host)] if host != NO_HOST else []
    fields += [*headers, ("Connection", "close")]
    if body or method == "POST":
        fields.append(("Content-Length", str(len(body))))
    head = f"{method} {target} HTTP/{http_version}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in fields)
    data = (head + "\r\n").encode("latin-1") + body
    # h11 reads the answer: told of a request like this one, it frames the answer as such.
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=method, target=target, headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    address, _, port = authority(url).partition(":")
    with trio.fail_after(20):
        async with await trio.open_tcp_stream(address, int(port)) as stream:
            await stream.send_all(data)
            response: h11.Response | None = None
            received = b""
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    received += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
    assert response is not None
    found: dict[str, list[str]] = {}
    for name, value in response.headers:
        found.setdefault(name.decode(), []).append(value.decode("latin-1"))
    return Answer(response.status_code, found, received)


async def loaded(client: httpx.AsyncClient, model: str) -> None:
    assert (await client.post(f"/api/models/load/{model}")).status_code == 200


# ---------------------------------------------------------------- a foreign Host (rebinding)


async def test_a_foreign_host_gets_nothing_so_a_rebinding_page_reads_and_changes_nothing(
    proxy_factory: StartProxy,
) -> None:
    """A page at ``http://evil.example:PORT`` whose name it rebinds to 127.0.0.1 is
    llamaswap's own origin to the browser: every answer was readable, every request
    allowed. Its requests still say ``Host: evil.example:PORT``: refused, all of them."""
    proxy = await proxy_factory(config(TWO))
    port = authority(proxy.url).partition(":")[2]
    rebound = f"evil.example:{port}"
    async with proxy.client() as client:
        await loaded(client, "alpha")
        requests = [
            ("GET", "/api/activity", b""),
            ("GET", "/api/events", b""),
            ("GET", "/logs", b""),
            ("GET", "/running", b""),
            ("GET", "/ui/", b""),
            ("GET", "/v1/models", b""),
            ("POST", "/api/models/unload", b""),
            ("POST", "/api/models/load/beta", b""),
            ("POST", "/v1/chat/completions", json.dumps(chat("beta")).encode()),
        ]
        for method, path, body in requests:
            headers = [("Content-Type", "application/json")] if body else []
            answer = await ask(proxy.url, method, path, headers, body, host=rebound)
            assert answer.status == 403, (method, path, answer)
            error = answer.error()
            assert error["code"] == "host_not_allowed"
            assert error["type"] == "permission_error"
            assert f"the Host '{rebound}' is not a name llamaswap answers to" in error["message"]
            assert "add it to allowedHosts" in error["message"]
        assert set(await running(client)) == {"alpha"}  # nothing unloaded, nothing loaded

        # The names clients use: loopback names, any IP address (a rebinding page's Host
        # is always a name), and HTTP/1.0 without Host (not a browser).
        for host in (
            authority(proxy.url),
            f"localhost:{port}",
            "LocalHost.",
            f"chat.localhost:{port}",
            f"[::1]:{port}",
            "192.168.1.20:8080",
        ):
            answer = await ask(proxy.url, "GET", "/running", host=host)
            assert answer.status == 200, (host, answer)
        answer = await ask(proxy.url, "GET", "/running", host=NO_HOST, http_version="1.0")
        assert answer.status == 200


async def test_allowed_hosts_adds_names_and_names_under_a_domain(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config(TWO, allowedHosts=["gpu-box.lan", "*.example.org"]))
    for host, status in [
        ("gpu-box.lan:8080", 200),
        ("GPU-BOX.LAN", 200),
        ("chat.example.org", 200),
        ("a.b.example.org:443", 200),
        ("example.org", 403),  # "*.example.org" is the names under it
        ("gpu-box.lan.evil.example", 403),
        ("evil.example", 403),
    ]:
        answer = await ask(proxy.url, "GET", "/health", host=host)
        assert answer.status == status, (host, answer)


async def test_a_star_in_allowed_hosts_allows_any_host(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config(TWO, allowedHosts=["*"]))
    assert (await ask(proxy.url, "GET", "/running", host="evil.example")).status == 200


async def test_the_name_llamaswap_listens_on_is_a_host_clients_use(
    proxy_factory: StartProxy,
) -> None:
    """``--listen NAME:PORT``: requests for ``NAME`` are served (serve() tells the app)."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    if not address.startswith("127.") or name.endswith("localhost"):
        pytest.skip(f"this machine's name {name!r} is not a loopback name other than localhost")
    proxy = await proxy_factory(config(TWO), args=["--listen", f"{name}:0"])
    port = authority(proxy.url).partition(":")[2]
    answer = await ask(proxy.url, "GET", "/running", host=f"{name}:{port}")
    assert answer.status == 200, answer
    other = await ask(proxy.url, "GET", "/running", host=f"{name}.evil.example")
    assert other.status == 403


# ---------------------------------------------------------------- cross-site state changes


async def test_a_page_of_another_site_cannot_change_state_with_default_settings(
    proxy_factory: StartProxy,
) -> None:
    """With the defaults a page on any site could unload, load, reload and cancel with a
    form or a fetch() that needs no preflight (CORS stops it reading the answer, after the
    fact). Now each is refused, and what clients that are not browsers send still works."""
    proxy = await proxy_factory(config(TWO))
    port = authority(proxy.url).partition(":")[2]
    own = own_origin(proxy.url)
    form = ("Content-Type", "application/x-www-form-urlencoded")
    async with proxy.client() as client:
        await loaded(client, "alpha")
        attempts: list[tuple[str, str, list[tuple[str, str]], bytes]] = [
            # a page elsewhere: fetch(url, {method: "POST", mode: "no-cors", body: "x"})
            (
                "POST",
                "/api/models/unload",
                [("Origin", EVIL), ("Content-Type", "text/plain")],
                b"x",
            ),
            ("POST", "/api/models/unload/alpha", [("Origin", EVIL)], b""),
            ("POST", "/api/models/load/beta", [("Origin", EVIL)], b""),
            ("POST", "/api/config/reload", [("Origin", EVIL)], b""),
            ("POST", "/api/inflight/1/cancel", [("Origin", EVIL), form], b"a=1"),
            # another port of this machine is another origin (a dev server, say)
            ("POST", "/api/models/unload", [("Origin", f"http://localhost:{port}")], b""),
            ("POST", "/api/models/unload", [("Origin", "http://127.0.0.1:1")], b""),
            # a sandboxed frame, a file:// page
            ("POST", "/api/models/unload", [("Origin", "null")], b""),
            # llama-swap's GET /unload, from a link or an <img> on another site
            (
                "GET",
                "/unload",
                [("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Mode", "no-cors")],
                b"",
            ),
            ("GET", "/unload", [("Sec-Fetch-Site", "same-site")], b""),
            ("HEAD", "/unload", [("Sec-Fetch-Site", "cross-site")], b""),
            # this origin, but as only a form can post: refused from any browser
            (
                "POST",
                "/api/models/unload",
                [("Origin", own), ("Content-Type", "text/plain;charset=UTF-8")],
                b"{}",
            ),
            ("POST", "/api/models/unload", [("Sec-Fetch-Site", "same-origin"), form], b""),
            (
                "POST",
                "/api/models/unload",
                [("Origin", own), ("Content-Type", "multipart/form-data; boundary=b")],
                b"--b--\r\n",
            ),
        ]
        for method, path, headers, body in attempts:
            answer = await ask(proxy.url, method, path, headers, body)
            assert answer.status == 403, (method, path, headers, answer)
            if method == "HEAD":
                continue
            error = answer.error()
            assert error["code"] == "cross_site_request", error
            assert error["message"].startswith(f"{method} '{path}' refused: "), error
            assert "corsOrigins" in error["message"] or "application/json" in error["message"]
        assert set(await running(client)) == {"alpha"}  # nothing unloaded, nothing loaded

        # What must keep working: the dashboard (its own origin, no body), curl (a form
        # type, no Origin), an SDK, and, as with llama-swap, a chat UI on any origin.
        dashboard = [("Origin", own), ("Sec-Fetch-Site", "same-origin")]
        answer = await ask(proxy.url, "POST", "/api/models/unload/alpha", dashboard)
        assert answer.status == 200, answer
        assert "alpha" not in await running(client)
        answer = await ask(proxy.url, "POST", "/api/models/load/alpha", [form], b"")  # curl -d ''
        assert answer.status == 200, answer
        sdk = await client.post("/v1/chat/completions", json=chat("alpha"))
        assert sdk.status_code == 200
        body = json.dumps(chat("alpha")).encode()
        chat_ui = [("Origin", EVIL), ("Content-Type", "application/json")]
        answer = await ask(proxy.url, "POST", "/v1/chat/completions", chat_ui, body)
        assert answer.status == 200, answer
        # The model server's own CORS answer (the fake server names any page, as
        # llama-server does), within the default "*".
        assert answer.header("access-control-allow-origin") == EVIL
        answer = await ask(proxy.url, "GET", "/unload", [("Sec-Fetch-Site", "none")])  # typed
        assert answer.status == 200, answer


async def test_a_cached_basic_key_does_not_let_a_form_change_state(
    proxy_factory: StartProxy,
) -> None:
    """A browser that was given the key at the Basic-auth prompt sends it with every
    request to llamaswap, a form post from another site's page included."""
    proxy = await proxy_factory(config(TWO, apiKeys=["sk-1"]))
    basic = ("Authorization", "Basic " + base64.b64encode(b"user:sk-1").decode())
    async with proxy.client(headers={"Authorization": "Bearer sk-1"}) as client:
        await loaded(client, "alpha")
        form = ("Content-Type", "application/x-www-form-urlencoded")
        for origin in (EVIL, own_origin(proxy.url)):
            headers = [basic, ("Origin", origin), form]
            answer = await ask(proxy.url, "POST", "/api/models/unload", headers, b"x=1")
            assert answer.status == 403, answer
            assert answer.error()["code"] == "cross_site_request"
        assert set(await running(client)) == {"alpha"}
        answer = await ask(proxy.url, "POST", "/api/models/unload", [basic])  # curl -u
        assert answer.status == 200, answer


# ---------------------------------------------------------------- who may read (CORS)


async def test_the_default_star_does_not_reach_the_management_api(
    proxy_factory: StartProxy,
) -> None:
    """``corsOrigins = ["*"]`` (the default) let any page read the activity log, the
    event stream and the logs. It now counts on the inference routes only."""
    proxy = await proxy_factory(config(TWO))
    async with proxy.client() as client:
        await loaded(client, "alpha")
    page = [("Origin", EVIL)]
    for path in ("/api/activity", "/logs", "/running", "/metrics", "/api/inflight"):
        answer = await ask(proxy.url, "GET", path, page)
        assert answer.status == 200, (path, answer)
        assert answer.header("access-control-allow-origin") is None, (path, answer)
    ask_post = [("Origin", EVIL), ("Access-Control-Request-Method", "POST")]
    answer = await ask(proxy.url, "OPTIONS", "/api/models/unload", ask_post)
    assert answer.status == 204
    assert answer.header("access-control-allow-origin") is None
    # The OpenAI-style API keeps llama-swap's default: any page may call it.
    answer = await ask(proxy.url, "OPTIONS", "/v1/chat/completions", ask_post)
    assert answer.header("access-control-allow-origin") == "*"
    answer = await ask(proxy.url, "GET", "/v1/models", page)
    assert answer.header("access-control-allow-origin") == "*"


async def test_listed_origins_may_use_everything_and_others_change_nothing(
    proxy_factory: StartProxy,
) -> None:
    """With ``corsOrigins`` listed, an unlisted origin could still unload (and run a
    completion, swapping models): it only could not read the answer."""
    app = "http://app.local"
    proxy = await proxy_factory(config(TWO, corsOrigins=[app]))
    body = json.dumps(chat("beta")).encode()
    as_json = ("Content-Type", "application/json")
    async with proxy.client() as client:
        await loaded(client, "alpha")
        for method, path, payload in [
            ("POST", "/api/models/unload", b""),
            ("POST", "/v1/chat/completions", body),
            ("POST", "/upstream/beta/v1/chat/completions", body),
        ]:
            headers = [("Origin", EVIL), as_json] if payload else [("Origin", EVIL)]
            answer = await ask(proxy.url, method, path, headers, payload)
            assert answer.status == 403, (path, answer)
            assert answer.error()["code"] == "cross_site_request"
            assert "add its origin to corsOrigins" in answer.error()["message"]
        assert set(await running(client)) == {"alpha"}

        preflight = [("Origin", app), ("Access-Control-Request-Method", "POST")]
        answer = await ask(proxy.url, "OPTIONS", "/api/models/unload", preflight)
        assert answer.header("access-control-allow-origin") == app
        answer = await ask(proxy.url, "GET", "/api/activity", [("Origin", app)])
        assert answer.header("access-control-allow-origin") == app
        answer = await ask(
            proxy.url, "POST", "/v1/chat/completions", [("Origin", app), as_json], body
        )
        assert answer.status == 200, answer
        assert answer.header("access-control-allow-origin") == app
        assert set(await running(client)) == {"beta"}
        answer = await ask(proxy.url, "POST", "/api/models/unload/beta", [("Origin", app)])
        assert answer.status == 200, answer
        assert answer.header("access-control-allow-origin") == app
        assert set(await running(client)) == set()


# ---------------------------------------------------------------- redirects, key fields


async def test_a_model_servers_cors_answer_is_never_widened(proxy_factory: StartProxy) -> None:
    """With the default ``corsOrigins = ["*"]``, a model server that names only some pages
    (``alpha``) or speaks no CORS (``beta``) is not widened: a page it does not name gets
    no ``Access-Control-Allow-Origin`` through llamaswap, so its browser keeps the answer
    from it. llamaswap's own answers (the model list) still name any page."""
    page = "http://localhost:3000"
    proxy = await proxy_factory(
        config(
            '[models.alpha]\ncmd = "${fake} --cors-origins http://localhost:3000"\n'
            "[models.beta]\ncmd = \"${fake} --cors-origins ''\"\n"
        )
    )
    body = json.dumps(chat("alpha")).encode()
    as_json = ("Content-Type", "application/json")
    for path in ["/v1/chat/completions", "/upstream/alpha/v1/chat/completions"]:
        answer = await ask(proxy.url, "POST", path, [("Origin", page), as_json], body)
        assert answer.status == 200, answer
        assert answer.header("access-control-allow-origin") == page
        assert answer.header("access-control-allow-credentials") == "true"
        answer = await ask(proxy.url, "POST", path, [("Origin", EVIL), as_json], body)
        assert answer.status == 200, answer  # the request ran: corsOrigins allows it
        assert answer.header("access-control-allow-origin") is None, answer
        assert answer.header("access-control-allow-credentials") is None
    beta = json.dumps(chat("beta")).encode()
    answer = await ask(
        proxy.url, "POST", "/v1/chat/completions", [("Origin", page), as_json], beta
    )
    assert answer.status == 200, answer
    assert answer.header("access-control-allow-origin") is None  # none added
    answer = await ask(proxy.url, "GET", "/v1/models", [("Origin", EVIL)])
    assert answer.header("access-control-allow-origin") == "*"  # llamaswap's own answer


async def test_a_merged_slash_redirect_is_relative(proxy_factory: StartProxy) -> None:
    """werkzeug answers ``//v1//models`` with a redirect to the merged path. Its URL was
    built from the request's Host (``http://<Host>/v1/models``): an open redirect for a
    Host llamaswap answers to. It is a path now, never one starting with ``//``."""
    proxy = await proxy_factory(config(TWO, allowedHosts=["*"]))
    for target, host, location in [
        ("//v1//models", None, "/v1/models"),
        ("//v1//models?x=1", None, "/v1/models?x=1"),
        ("/ui//x.js", None, "/ui/x.js"),
        ("//v1//models", "evil.example", "/v1/models"),
        ("//ui//evil.example", "evil.example", "/ui/evil.example"),
    ]:
        answer = await ask(proxy.url, "GET", target, host=host)
        assert answer.status == 308, (target, answer)
        assert answer.header("location") == location, (target, answer)


@pytest.mark.parametrize(
    "fields",
    [
        [("x-api-key", "wrong"), ("x-api-key", "sk-1")],
        [("x-api-key", "sk-1"), ("x-api-key", "wrong")],
        [("Authorization", "Bearer wrong"), ("Authorization", "Bearer sk-1")],
        [("Authorization", "Bearer sk-1"), ("authorization", "Bearer wrong")],
    ],
    ids=["x-api-key-last-good", "x-api-key-first-good", "bearer-last-good", "bearer-first-good"],
)
async def test_two_key_fields_are_refused_alike_on_every_route(
    proxy_factory: StartProxy, fields: list[tuple[str, str]]
) -> None:
    """The management routes took the last ``x-api-key``, the proxied routes the first:
    one request could pass one check and fail the other. Both refuse it now."""
    proxy = await proxy_factory(config(TWO, apiKeys=["sk-1"]))
    body = json.dumps(chat("alpha")).encode()
    for method, path, payload in [
        ("GET", "/running", b""),
        ("POST", "/api/models/unload", b""),
        ("POST", "/v1/chat/completions", body),
        ("POST", "/upstream/alpha/v1/chat/completions", body),
    ]:
        headers = [*fields, ("Content-Type", "application/json")]
        answer = await ask(proxy.url, method, path, headers, payload)
        assert answer.status == 400, (path, answer)
        name = fields[0][0].lower()
        assert f"more than one {name!r} field" in answer.error()["message"]
    good = [("x-api-key", "sk-1"), ("Authorization", "Bearer sk-1")]  # one of each: fine
    assert (await ask(proxy.url, "GET", "/running", good)).status == 200


# ---------------------------------------------------------------- in a real browser

CHROMIUM = Path(os.environ.get("LLAMASWAP_CHROMIUM", "/usr/bin/chromium"))


def _browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed: pip install -e '.[test]'"
    if not os.access(CHROMIUM, os.X_OK):
        return (
            f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set LLAMASWAP_CHROMIUM)"
        )
    return None


BROWSER_MISSING = _browser_missing()

ATTACK = """<!doctype html>
<title>cute cats</title>
<form method="POST" action="{target}/api/models/unload" enctype="text/plain">
  <input name="a" value="b">
</form>
"""


async def serve_page(nursery: trio.Nursery, html: str) -> str:
    """A one-page HTTP server on 127.0.0.1, port 0: another origin than llamaswap's."""
    page = html.encode()

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            received = b""
            with trio.move_on_after(10):
                while b"\r\n\r\n" not in received:
                    if not (chunk := await stream.receive_some(65536)):
                        return
                    received += chunk
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                f"Content-Length: {len(page)}\r\n\r\n"
            )
            await stream.send_all(head.encode() + page)

    listeners = await nursery.start(partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


def _attack_in_browser(page_url: str, target: str, rebound: str) -> dict[str, str]:
    """What the hostile pages' scripts saw (each step's outcome, for the failure message)."""
    seen: dict[str, str] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            timeout=60_000,
            # evil.example is this machine, as after a DNS rebinding.
            args=["--host-resolver-rules=MAP evil.example 127.0.0.1"],
        )
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(15_000)
            page.goto(page_url)
            # A fetch() that needs no preflight: it reaches the server whatever CORS says.
            seen["no-cors fetch"] = page.evaluate(
                """async (target) => {
                    try {
                        const r = await fetch(target + "/api/models/unload/alpha",
                            {method: "POST", mode: "no-cors", body: "x"});
                        return "sent (" + r.type + ")";
                    } catch (e) { return "failed: " + e; }
                }""",
                target,
            )
            seen["read activity"] = page.evaluate(
                """async (target) => {
                    try { return await (await fetch(target + "/api/activity")).text(); }
                    catch (e) { return "failed: " + e; }
                }""",
                target,
            )
            with page.expect_navigation():
                page.evaluate("document.forms[0].submit()")
            seen["form post"] = page.content()
            # The rebinding page: same-origin with llamaswap, by name.
            page.goto(f"{rebound}/health")
            seen["rebound page"] = page.content()
            seen["rebound unload"] = page.evaluate(
                """async () => {
                    const r = await fetch("/api/models/unload", {method: "POST"});
                    return r.status + " " + await r.text();
                }"""
            )
        finally:
            browser.close()
    return seen


@pytest.mark.ui
@pytest.mark.skipif(BROWSER_MISSING is not None, reason=BROWSER_MISSING or "")
async def test_in_chromium_a_page_elsewhere_cannot_unload_a_model(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(config(TWO))
    port = authority(proxy.url).partition(":")[2]
    page_url = await serve_page(nursery, ATTACK.format(target=proxy.url))
    async with proxy.client() as client:
        await loaded(client, "alpha")
        run = partial(_attack_in_browser, page_url, proxy.url, f"http://evil.example:{port}")
        seen = await trio.to_thread.run_sync(run)
        assert set(await running(client)) == {"alpha"}, seen  # still loaded
    assert seen["read activity"].startswith("failed: TypeError"), seen  # CORS: not readable
    assert "cross_site_request" in seen["form post"], seen
    assert "host_not_allowed" in seen["rebound page"], seen
    assert seen["rebound unload"].startswith("403 "), seen
    assert "host_not_allowed" in seen["rebound unload"], seen
