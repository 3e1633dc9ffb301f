"""More of the proxy end to end: disconnects mid-stream, peers, keys, limits, passthrough."""

from __future__ import annotations

import base64
import gc
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import h11
import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess, open_raw_request, running
from tests.e2e.test_operations import activity_of, wait_for_request
from tests.e2e.test_proxy import chat, config, sdk_generators_left_open
from tests.e2e.test_upstream_pool import Peer, serve_forever, start_server


async def slow_stream(proxy: ProxyProcess) -> tuple[trio.SocketStream, bytes]:
    """A raw stream from model ``slow`` (50 s long if nobody stops it), once three of its
    events have arrived, and what arrived."""
    body = chat("slow", stream=True, max_tokens=1000)
    stream = await open_raw_request(proxy.url, "/v1/chat/completions", json.dumps(body).encode())
    received = b""
    while received.count(b"data: {") < 3:
        received += await stream.receive_some()
    assert received.startswith(b"HTTP/1.1 200")
    return stream, received


async def test_client_disconnect_mid_stream_reaches_the_model_server(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config(
            '[models.slow]\ncmd = "${fake} --tokens-per-second 20"\n'
            '[models.other]\ncmd = "${fake}"'
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            stream, _ = await slow_stream(proxy)
            await stream.aclose()
            await proxy.output.wait_for(r"\[slow\] fake_server: client disconnected after \d+")
            # The slot freed: a request that must evict 'slow' goes through at once.
            other = await client.post("/v1/chat/completions", json=chat("other"))
            assert other.status_code == 200
            assert set(await running(client)) == {"other"}


async def test_a_stream_whose_model_is_unloaded_ends_saying_so(
    proxy_factory: StartProxy,
) -> None:
    """Its last event is the 503 ``model_unloaded`` error, and its record says so too
    (it was the model server's connection breaking off, as in a crash)."""
    proxy = await proxy_factory(config('[models.slow]\ncmd = "${fake} --tokens-per-second 20"'))
    async with proxy.client() as client:
        with trio.fail_after(30):
            stream, received = await slow_stream(proxy)
            assert (await client.post("/api/models/unload/slow")).status_code == 200
            while not received.endswith(b"\r\n0\r\n\r\n"):  # the stream's last chunk
                received += await stream.receive_some()
            await stream.aclose()
            record = await activity_of(client, "slow")
    *_, last = [line for line in received.split(b"\n") if line.startswith(b"data: {")]
    error = json.loads(last.removeprefix(b"data: "))["error"]
    assert error["code"] == "model_unloaded"
    assert error["message"] == (
        "model 'slow' was unloaded while the request was being served (unload requested)"
    )
    assert record["error"] == error["message"]


async def test_peers_are_reached_by_prefix_and_bare_name(proxy_factory: StartProxy) -> None:
    back = await proxy_factory(config('[models.coder]\ncmd = "${fake}"', apiKeys=["back-key"]))
    front = await proxy_factory(
        config(
            '[models.local]\ncmd = "${fake}"\n'
            f'[peers.gpu2]\nproxy = "{back.url}"\napiKey = "back-key"\nmodels = ["coder"]'
        )
    )
    async with front.client() as client:
        with trio.fail_after(30):
            for name in ("gpu2/coder", "coder"):
                response = await client.post("/v1/chat/completions", json=chat(name))
                assert response.status_code == 200, response.text
                assert response.json()["model"] == "coder"
                assert response.headers.get_list("x-llamaswap-upstream") == ["gpu2/coder"]
            body = chat("gpu2/coder", stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                # The peer (a llamaswap) said it already: once is enough.
                assert stream.headers.get_list("x-accel-buffering") == ["no"]
                await stream.aread()
            listed = {m["id"] for m in (await client.get("/v1/models")).json()["data"]}
            assert listed == {"local", "gpu2/coder"}
            for action in ("load", "unload"):
                refused = await client.post(f"/api/models/{action}/gpu2/coder")
                assert refused.status_code == 404
                assert refused.json()["error"]["message"] == (
                    "model 'gpu2/coder' belongs to the peer 'gpu2': "
                    "llamaswap loads and unloads only its own models"
                )
            assert await running(client) == {}  # peers bypass the local scheduler
    assert "loading model 'coder'" in back.output.text()


async def test_api_keys(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"', apiKeys=["k1", "k2"]))
    basic = base64.b64encode(b"anyone:k2").decode()
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.get("/health")).status_code == 200
            denied = await client.get("/v1/models")
            assert denied.status_code == 401
            assert denied.headers["www-authenticate"] == 'Basic realm="llamaswap"'
            assert denied.json()["error"]["code"] == "invalid_api_key"
            wrong = await client.post(
                "/v1/chat/completions", json=chat("m"), headers={"x-api-key": "nope"}
            )
            assert wrong.status_code == 401
            for headers in (
                {"authorization": "Bearer k1"},
                {"x-api-key": "k2"},
                {"authorization": f"Basic {basic}"},
            ):
                ok = await client.post("/v1/chat/completions", json=chat("m"), headers=headers)
                assert ok.status_code == 200


async def test_body_larger_than_max_body_bytes_is_413(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"', maxBodyBytes=1000))
    async with proxy.client() as client:
        with trio.fail_after(30):
            big = chat("m", padding="x" * 2000)
            response = await client.post("/v1/chat/completions", json=big)
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "request_too_large"

            async def chunked() -> AsyncIterator[bytes]:
                yield json.dumps(big).encode()

            streamed = await client.post("/v1/chat/completions", content=chunked())
            assert streamed.status_code == 413
            small = await client.post("/v1/chat/completions", json=chat("m"))
            assert small.status_code == 200
    assert "loading model 'm'" in proxy.output.text()


async def test_a_compressed_body_is_refused_by_name(proxy_factory: StartProxy) -> None:
    """llamaswap reads the model from the body and does not decompress it: the client is
    told so (it was told the body was not UTF-8)."""
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))
    packed = gzip.compress(json.dumps(chat("m")).encode())
    async with proxy.client() as client:
        with trio.fail_after(30):
            for encoding in ("gzip", "GZIP"):
                headers = {"content-encoding": encoding, "content-type": "application/json"}
                answer = await client.post("/v1/chat/completions", content=packed, headers=headers)
                assert answer.status_code == 400
                assert answer.json()["error"]["message"] == (
                    "the request body is compressed (Content-Encoding: gzip), and llamaswap "
                    "reads the model from it: send it uncompressed"
                )
            plain = {"content-encoding": "identity"}
            answer = await client.post("/v1/chat/completions", json=chat("m"), headers=plain)
            assert answer.status_code == 200
    assert "loading model 'm'" in proxy.output.text()


async def test_a_client_that_waits_for_100_continue_is_refused_before_it_sends_its_body(
    proxy_factory: StartProxy,
) -> None:
    """``Expect: 100-continue``: llamaswap says 100 when it reads the body, so a body over
    maxBodyBytes is refused unsent. hypercorn said 100 as soon as it had read the head,
    and the client sent the body to be refused. On a kept-alive connection each request
    waits for its own."""
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"', maxBodyBytes=1000))
    body = json.dumps(chat("m")).encode()
    client = h11.Connection(h11.CLIENT)

    def request(length: int) -> bytes:
        fields = [("Host", "localhost"), ("Content-Type", "application/json")]
        fields += [("Content-Length", str(length)), ("Expect", "100-continue")]
        return (
            client.send(h11.Request(method="POST", target="/v1/chat/completions", headers=fields))
            or b""
        )

    host, _, port = proxy.url.removeprefix("http://").partition(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:

        async def next_event() -> object:
            while (event := client.next_event()) is h11.NEED_DATA:
                client.receive_data(await stream.receive_some())
            return event

        async def rest() -> bytes:
            data = b""
            while isinstance(event := await next_event(), h11.Data):
                data += event.data
            assert isinstance(event, h11.EndOfMessage), event
            return data

        with trio.fail_after(30):
            await stream.send_all(request(len(body)))
            interim = await next_event()
            assert isinstance(interim, h11.InformationalResponse), interim
            assert interim.status_code == 100
            await stream.send_all(
                b"".join(client.send(e) or b"" for e in (h11.Data(data=body), h11.EndOfMessage()))
            )
            answer = await next_event()
            assert isinstance(answer, h11.Response), answer
            assert answer.status_code == 200
            await rest()

            client.start_next_cycle()
            await stream.send_all(request(2000))
            refusal = await next_event()  # not a 100 first
            assert isinstance(refusal, h11.Response), refusal
            assert refusal.status_code == 413
            assert (b"connection", b"close") in refusal.headers
            assert json.loads(await rest())["error"]["code"] == "request_too_large"
            assert await stream.receive_some() == b""  # closed: the body never came


async def test_what_a_client_sends_is_kept_cut_short_in_the_activity_log_and_logs(
    proxy_factory: StartProxy,
) -> None:
    # A request may name any model (up to maxBodyBytes) and any /upstream path (up to the
    # 64 KiB head). The last 1000 records and log lines stay in memory: each stays small,
    # whatever the client sent (a megabyte name held three megabytes, for good).
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))
    name = "n" * 1_000_000
    path = "/upstream/" + "p" * 60_000 + "/x"
    async with proxy.client() as client:
        with trio.fail_after(30):
            named = await client.post("/v1/chat/completions", json=chat(name))
            upstream = await client.get(path)
            records = (await client.get("/api/activity")).json()["activity"]
            logs = (await client.get("/logs")).text
    assert named.status_code == upstream.status_code == 404
    quoted = f"'{'n' * 200}…' (1000000 characters)"
    assert named.json()["error"]["message"] == (
        f"model {quoted} not found; GET /v1/models lists the models"
    )
    by_path, by_name = records  # newest first
    assert by_name["metadata"]["requested_model"] == "n" * 4096 + "… (1000000 characters)"
    assert by_name["error"] == named.json()["error"]["message"]
    assert by_path["path"] == path[:4096] + f"… ({len(path)} characters)"
    # The forwarder logs the 404 with the path: that line is cut at 16 KiB.
    (logged,) = [line for line in logs.splitlines() if "GET /upstream/ppp" in line]
    head, _, tail = logged.rpartition("… (")
    assert len(head) == 16 * 1024
    assert tail.removesuffix(" characters)").isdigit()
    assert int(tail.removesuffix(" characters)")) > len(path)


#: An upload far larger than the kernel's and hypercorn's buffers hold unread.
LARGE_UPLOAD = 16 * 1024 * 1024


async def answers_uploads_early(peer: Peer, index: int) -> None:
    """A model server that answers ``POST /upload`` with 413 after its head, then closes
    with the body unread, and answers anything else with its target."""
    while (head := await peer.head()) is not None:
        if head.target == b"/upload":
            answer = h11.Response(status_code=413, headers=[(b"content-length", b"9")])
            await peer.send(answer, h11.Data(data=b"too large"), h11.EndOfMessage())
            return
        while not isinstance(await peer._next(), h11.EndOfMessage):
            pass
        await peer.respond(head.target)


@pytest.mark.parametrize("early", ["llamaswap", "model server"])
async def test_an_answer_before_a_large_upload_is_read_reaches_a_client_that_sends_first(
    proxy_factory: StartProxy, nursery: trio.Nursery, early: str
) -> None:
    """An answer that goes out before the request's body is in (llamaswap's own 413, or a
    model server's) reaches a client that writes its whole body before it reads, as most
    SDKs do, and ends the request: its model is free for the next one at once."""
    server = await start_server(nursery, answers_uploads_early)
    proxy = await proxy_factory(
        config(
            f'[models.m]\ncmd = "${{fake}}"\nproxy = "{server.url}"\ncheckEndpoint = "none"\n'
            '[models.other]\ncmd = "${fake}"',
            maxBodyBytes=LARGE_UPLOAD // 2 if early == "llamaswap" else LARGE_UPLOAD,
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.get("/upstream/m/ready")).text == "/ready"  # m is loaded
            # A blocking client (httpx's async one warns when a failed write leaves its
            # body's generator unfinished); its own timeout ends it if the proxy hangs.
            with httpx.Client(base_url=proxy.url, timeout=20) as blocking:
                post = partial(blocking.post, "/upstream/m/upload", content=b"x" * LARGE_UPLOAD)
                answer = await trio.to_thread.run_sync(post, abandon_on_cancel=True)
            assert answer.status_code == 413
            if early == "model server":
                assert answer.text == "too large"
            else:
                assert answer.json()["error"]["code"] == "request_too_large"
            other = await client.post("/v1/chat/completions", json=chat("other"))
            assert other.status_code == 200
            assert set(await running(client)) == {"other"}


async def test_upstream_passthrough_with_slashes_in_ids(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config('[models."org/chat"]\ncmd = "${fake}"'))
    async with proxy.client() as client:
        with trio.fail_after(30):
            health = await client.get("/upstream/org/chat/health")
            assert health.status_code == 200
            assert health.json() == {"status": "ok"}
            models = await client.get("/upstream/org/chat/v1/models")
            assert models.json()["data"][0]["id"] == "org/chat"
            missing = await client.get("/upstream/nope/health")
            assert missing.status_code == 404
            # The path reaches the server as the client escaped it (its own 404 says so).
            spaced = await client.get("/upstream/org/chat/a%20b%3F?x=1")
            assert spaced.status_code == 404
            assert spaced.json()["error"]["message"] == "no route for GET /a b?"


async def test_upstream_paths_reach_the_server_as_the_client_escaped_them(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    """``a%2Fb`` is one path segment (a Hugging Face ``org%2Fname``): it must not become
    two; and a model name may itself arrive escaped."""
    server = await start_server(nursery, serve_forever)  # answers with the target it got
    proxy = await proxy_factory(
        config(
            f'[models."org/m"]\ncmd = "${{fake}}"\nproxy = "{server.url}"\ncheckEndpoint = "none"'
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            for sent, received in [
                ("/upstream/org/m/v1/models/a%2Fb?x=%2F", "/v1/models/a%2Fb?x=%2F"),
                ("/upstream/org%2Fm/a%2fb/%ff", "/a%2fb/%ff"),
                ("/upstream/org/m/a%20b%3F", "/a%20b%3F"),
                ("/upstream/org/m/caf%C3%A9/%25", "/caf%C3%A9/%25"),
            ]:
                answer = await client.get(sent)
                assert answer.status_code == 200, answer.text
                assert answer.text == received


async def test_upstream_streams_large_and_chunked_bodies_through(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))
    padding = "x" * (300 * 1024)  # over the size read before queueing: streamed instead
    large = json.dumps(chat("m", padding=padding)).encode()

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(large), 64 * 1024):
            yield large[start : start + 64 * 1024]

    async with proxy.client() as client:
        with trio.fail_after(30):
            sized = await client.post("/upstream/m/v1/chat/completions", content=large)
            streamed = await client.post("/upstream/m/v1/chat/completions", content=chunked())
    for response in (sized, streamed):
        assert response.status_code == 200
        assert response.json()["usage"]["prompt_tokens"] > 0


async def test_multipart_routes_and_upstream_errors_pass_through(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.whisper]\ncmd = "${fake}"'))
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post(
                "/v1/images/edits",
                data={"model": "whisper"},
                files={"image": ("a.png", b"\x89PNG", "image/png")},
            )
    # The fake server has no image route: its own 404 comes back untouched.
    assert response.status_code == 404
    assert response.headers["x-fake-model"] == "whisper"


async def test_preload_hook_loads_at_startup(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(
        config('[models.m]\ncmd = "${fake}"\n[hooks.on_startup]\npreload = ["m"]')
    )
    await proxy.output.wait_for(r"model 'm': started pid")
    async with proxy.client() as client:
        with trio.fail_after(30):
            loaded = await client.post("/api/models/load/m")
            assert loaded.json() == {"model": "m", "state": "ready"}


async def test_a_preload_that_fails_is_logged_and_the_proxy_keeps_serving(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config(
            '[models.broken]\ncmd = "${fake} --fail-start"\n[models.m]\ncmd = "${fake}"\n'
            '[hooks.on_startup]\npreload = ["broken"]'
        )
    )
    await proxy.output.wait_for(r"preloading 'broken' failed: model 'broken' failed to start")
    async with proxy.client() as client:
        with trio.fail_after(30):
            answer = await client.post("/v1/chat/completions", json=chat("m"))
            assert answer.status_code == 200
    assert await proxy.terminate() == 0


async def test_json_python_cannot_read_is_a_400_not_a_crash(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))
    deep = b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post(
                "/v1/chat/completions", content=deep, headers={"content-type": "application/json"}
            )
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert "nests arrays and objects too deeply" in error["message"]
            assert "x-llamaswap-upstream" not in response.headers  # llamaswap's own answer
            activity = (await client.get("/api/activity")).json()["activity"]
    assert [record["status"] for record in activity[:1]] == [400]
    assert "Traceback" not in proxy.output.text()
    assert "loading model" not in proxy.output.text()


async def test_a_body_with_a_number_python_cannot_read_goes_through_untouched(
    proxy_factory: StartProxy,
) -> None:
    """llamaswap reads only the model's name; the model server judges the rest (here the
    fake server, itself on Python's json, refuses the number)."""
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))
    long_number = b'{"model": "m", "seed": ' + b"1" * 5000 + b"}"
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post(
                "/v1/chat/completions",
                content=long_number,
                headers={"content-type": "application/json"},
            )
    assert response.status_code == 400
    assert response.headers["x-llamaswap-upstream"] == "m"
    assert "not valid JSON" in response.json()["error"]["message"]
    assert "Traceback" not in proxy.output.text()


WEBSOCKET_UPGRADE = (
    "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def test_a_websocket_upgrade_off_the_passthrough_routes_is_refused_with_a_json_error(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))
    host, _, port = proxy.url.removeprefix("http://").partition(":")
    for path in ("/", "/v1/chat/completions", "/health"):
        with trio.fail_after(30):
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(WEBSOCKET_UPGRADE.format(path=path).encode())
                answer = b""
                while chunk := await stream.receive_some():  # until the proxy closes it
                    answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), answer
        assert b"content-type: application/json" in head.lower()
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"] == (
            "WebSockets are relayed on /upstream/{model}/{path} and /comfyui/{path} only"
        )
    assert "Traceback" not in proxy.output.text()
    assert "loading model" not in proxy.output.text()


async def half_an_answer(peer: Peer, index: int) -> None:
    """A model server that answers with half a body: the rest never comes, and the
    connection ends at once (on the path ``/cut``) or when the proxy closes it."""
    request = await peer.request()
    assert request is not None
    await peer.send(h11.Response(status_code=200, headers=[(b"content-length", b"100")]))
    await peer.stream.send_all(b'{"choices": [')
    if not request[0].target.startswith(b"/cut/"):
        assert await peer.stream.receive_some() == b""  # the proxy closed it


@pytest.mark.parametrize("ending", ["model server breaks off", "operator cancels"])
async def test_an_answer_cut_short_breaks_the_connection_without_a_traceback(
    proxy_factory: StartProxy, nursery: trio.Nursery, ending: str
) -> None:
    """A response that is not an event stream has no way to carry an error once it has
    started: the client's connection is closed (it sees the body fall short), the
    request is recorded with the error, and the proxy logs one line, not a traceback."""
    server = await start_server(nursery, half_an_answer)
    prefix = "/cut" if ending == "model server breaks off" else ""
    proxy = await proxy_factory(
        config(
            f'[models.half]\ncmd = "${{fake}}"\nproxy = "{server.url}{prefix}"\n'
            'checkEndpoint = "none"'  # the script is the server; the process just runs
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            async with client.stream("POST", "/v1/chat/completions", json=chat("half")) as answer:
                assert answer.status_code == 200
                assert answer.headers["content-length"] == "100"
                if ending == "operator cancels":
                    entry = await wait_for_request(client, "half", "serving")
                    cancel = await client.post(f"/api/inflight/{entry['id']}/cancel")
                    assert cancel.json() == {"cancelled": entry["id"], "state": "serving"}
                with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
                    await answer.aread()
            record = await activity_of(client, "half")
            assert (await client.get("/v1/models")).status_code == 200  # still serving
    expected = "broke off mid-response" if prefix else "cancelled by an operator"
    assert expected in record["error"]
    assert record["status"] == 200  # the status already sent
    assert f"POST /v1/chat/completions: {record['error']}" in proxy.output.text()
    assert "Traceback" not in proxy.output.text()


PRETTY_ERROR = b'{\n  "error": {\n    "message": "context too long",\n    "code": 400\n  }\n}\n'
HTML_ERROR = b"<html>\n<body>\n<h1>502 Bad Gateway</h1>\n</body>\n</html>\n"


def slow_health_then_an_error() -> Callable[[Peer, int], Awaitable[None]]:
    """A model server that is not up before its start (the probe llamaswap makes first),
    takes a while to turn healthy (so a request waits, with the loading state), then
    answers every request with an error body on several lines: JSON, or (on the path
    ``/html``) an HTML page."""
    checks = 0

    async def script(peer: Peer, index: int) -> None:
        nonlocal checks
        while (request := await peer.request()) is not None:
            head, _ = request
            if head.target.endswith(b"/health"):
                checks += 1
                if checks == 2:
                    await trio.sleep(1.0)
                status, body = (503, b"no") if checks == 1 else (200, b"OK")
            elif head.target.startswith(b"/html/"):
                status, body = 502, HTML_ERROR
            else:
                status, body = 400, PRETTY_ERROR
            length = [(b"content-length", str(len(body)).encode())]
            await peer.send(h11.Response(status_code=status, headers=length), h11.Data(data=body))
            await peer.send(h11.EndOfMessage())

    return script


@sdk_generators_left_open
@pytest.mark.parametrize("page", ["json", "html"])
async def test_an_error_after_the_loading_state_is_one_event_an_sdk_reads(
    proxy_factory: StartProxy, nursery: trio.Nursery, page: str
) -> None:
    """The stream already said 200 when the model server answers with an error: the
    error goes out as one event an OpenAI client parses (an event's data is one line)."""
    server = await start_server(nursery, slow_health_then_an_error())
    prefix = "/html" if page == "html" else ""
    proxy = await proxy_factory(
        config(
            f'[models.m]\ncmd = "${{fake}}"\nproxy = "{server.url}{prefix}"\n'
            "sendLoadingState = true"
        )
    )
    client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="none", max_retries=0)
    with trio.fail_after(30):
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        with pytest.raises(openai.APIError) as caught:
            async for _ in stream:
                pass
        await client.close()
    message = caught.value.message
    del stream, caught  # the SDK's generators, which the error's traceback holds too, are
    gc.collect()  # finalised here, under this test's filter, not in whichever test is next
    if page == "json":
        assert message == "context too long"
    else:
        assert "answered 502: <html> <body> <h1>502 Bad Gateway</h1>" in message
