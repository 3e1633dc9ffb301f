"""OpenTelemetry traces end to end (``[tracing]``, docs/tracing.md): the real proxy exports
to an in-process OTLP/HTTP collector; the fake model server shows the ``traceparent`` it
received (``x-fake-traceparent``)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from tests.e2e.harness import REPO, child_env, start_proxy, stop_proxy, survivors
from tests.e2e.test_proxy import chat, config

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.otel_collector import attributes, running_collector

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"

MODELS = """
[models.one]
cmd = "${fake} --load-seconds 0.3 --tokens-per-second 40"
[routing.scheduler]
use = "serial"
"""


def by_name(spans: list[Span]) -> dict[str, Span]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


async def test_a_request_is_a_span_tree_under_the_clients_trace_and_the_model_server_joins_it(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with running_collector() as collector:
        text = config(MODELS) + f'\n[tracing]\nendpoint = "{collector.url}"\n'
        proxy = await start_proxy(nursery, text, tmp_path)
        try:
            async with proxy.client() as client:
                with trio.fail_after(30):
                    body = chat(
                        "one", stream=True, max_tokens=8, stream_options={"include_usage": True}
                    )
                    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
                    response = await client.post(
                        "/v1/chat/completions", json=body, headers=headers
                    )
                    assert response.status_code == 200
                    assert "data: [DONE]" in response.text
            # The batch processor's delay (5 s) has not passed: the spans reach the
            # collector because llamaswap sends what is queued as it exits.
            assert await proxy.terminate() == 0
        finally:
            await stop_proxy(proxy)
        spans = collector.wait_for(6, timeout=0)
    assert collector.services == {"llamaswap"}
    named = by_name(spans)
    assert set(named) == {
        "POST /v1/chat/completions",
        "admission wait",
        "model load",
        "upstream",
        "time to first byte",
        "streaming",
    }
    request = named["POST /v1/chat/completions"]
    upstream = named["upstream"]
    assert {span.trace_id.hex() for span in spans} == {CLIENT_TRACE}
    assert request.parent_span_id.hex() == CLIENT_SPAN
    assert request.kind == Span.SPAN_KIND_SERVER
    assert upstream.kind == Span.SPAN_KIND_CLIENT
    for name in ("admission wait", "model load", "upstream"):
        assert named[name].parent_span_id == request.span_id, name
    for name in ("time to first byte", "streaming"):
        assert named[name].parent_span_id == upstream.span_id, name

    # The model server was sent a traceparent in the client's trace, naming the upstream
    # span as its parent, and the client's tracestate.
    version, trace_id, parent_id, flags = response.headers["x-fake-traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
    assert parent_id == upstream.span_id.hex()

    # Time runs forward through the phases, inside the request.
    def times(name: str) -> tuple[int, int]:
        return named[name].start_time_unix_nano, named[name].end_time_unix_nano

    begin, end = times("POST /v1/chat/completions")
    queued, loading = times("admission wait"), times("model load")
    sent, ttfb, streaming = times("upstream"), times("time to first byte"), times("streaming")
    assert begin <= queued[0] <= queued[1] <= loading[0] < loading[1] <= sent[0]
    assert loading[1] - loading[0] >= 0.25e9  # --load-seconds 0.3
    assert sent == (ttfb[0], streaming[1])
    assert ttfb[1] == streaming[0]
    assert streaming[1] - streaming[0] >= 0.1e9  # 8 tokens at 40 a second
    assert sent[1] <= end
    fields = attributes(request)
    assert fields["llamaswap.model"] == "one"
    assert fields["llamaswap.band"] == "normal"
    assert fields["llamaswap.priority"] == 0
    assert fields["llamaswap.scheduler"] == "serial"
    assert isinstance(fields["llamaswap.score"], float)
    assert fields["http.response.status_code"] == 200
    assert isinstance(fields["llamaswap.request_id"], int)
    assert fields["gen_ai.usage.output_tokens"] == 8
    assert request.status.code == request.status.STATUS_CODE_UNSET


async def test_a_refused_request_is_an_error_span_and_a_new_trace_without_traceparent(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with running_collector() as collector:
        text = config(MODELS, apiKeys=["secret"])
        text += f'\n[tracing]\nendpoint = "{collector.url}"\nserviceName = "edge"\n'
        proxy = await start_proxy(nursery, text, tmp_path, env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
        try:
            async with proxy.client() as client:
                with trio.fail_after(30):
                    response = await client.post("/v1/chat/completions", json=chat("one"))
                    assert response.status_code == 401
                    # OTEL_BSP_SCHEDULE_DELAY is the SDK's: sent within 50 ms, not at exit.
                    spans = await trio.to_thread.run_sync(collector.wait_for, 1, 20.0)
        finally:
            await stop_proxy(proxy)
    assert collector.services == {"edge"}
    [request] = spans
    assert request.name == "POST /v1/chat/completions"
    assert request.parent_span_id == b""  # a trace of its own
    assert request.status.code == request.status.STATUS_CODE_ERROR
    fields = attributes(request)
    assert fields["http.response.status_code"] == 401
    assert fields["llamaswap.error"].startswith("missing or invalid API key")
    assert request.status.message == fields["llamaswap.error"]


#: Starts llamaswap in this process without [tracing], sends a request with a
#: traceparent through it, and prints what reached the model server and which
#: opentelemetry modules were imported.
_UNTRACED = """
import json, sys
import httpx, trio
from llamaswap._serve import serve
from llamaswap.config import loads_config

async def main():
    config = loads_config(sys.argv[1])
    async with trio.open_nursery() as nursery:
        [url] = await nursery.start(lambda task_status: serve(
            config, listen=["127.0.0.1:0"], task_status=task_status))
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": "one", "messages": [{"role": "user", "content": "hi"}]}
            answer = await client.post(
                "/v1/chat/completions", json=body, headers={"traceparent": sys.argv[2]})
        nursery.cancel_scope.cancel()
    modules = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"status": answer.status_code,
                      "received": answer.headers.get("x-fake-traceparent"),
                      "modules": modules}))

trio.run(main)
"""


def test_without_tracing_nothing_of_opentelemetry_is_imported_and_traceparent_passes() -> None:
    text = config('[models.one]\ncmd = "${fake}"')
    marker = uuid.uuid4().hex
    result = subprocess.run(
        [sys.executable, "-c", _UNTRACED, text, TRACEPARENT],
        cwd=REPO,
        env=child_env(marker),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert not survivors(marker)
    assert outcome == {"status": 200, "received": TRACEPARENT, "modules": []}


async def test_a_collector_that_is_down_costs_spans_not_requests_nor_a_hung_exit(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with running_collector() as gone:
        url = gone.url  # a port nobody listens on once the block ends
    text = config(MODELS) + f'\n[tracing]\nendpoint = "{url}"\n'
    proxy = await start_proxy(nursery, text, tmp_path)
    try:
        async with proxy.client() as client:
            with trio.fail_after(30):
                response = await client.post("/v1/chat/completions", json=chat("one"))
                assert response.status_code == 200
        # The spans still queued are tried for at most TRACE_FLUSH (5 s), then given up
        # (unbounded, the exporter's flush and then its shutdown would take 10 s each).
        with trio.fail_after(12):
            assert await proxy.terminate() == 0
    finally:
        await stop_proxy(proxy)
