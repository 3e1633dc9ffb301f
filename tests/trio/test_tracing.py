"""A request's trace on Trio's mock clock, through the real Recorder: the span times are
the lifecycle points', the client's ``traceparent`` is continued and replaced on the way
upstream, and a request that failed says so (``observability/tracing.py``)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llamaswap.config.model import TracingConfig
from llamaswap.proxy.exchange import CLIENT_LEFT, Exchange
from tests.trio.test_recorder import recording

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from llamaswap.observability.tracing import Tracing, open_tracing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def tracing() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    opened = open_tracing(TracingConfig(), exporter=exporter)
    assert opened is not None
    return opened, exporter


def finished(traced: Tracing, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    assert traced.provider.force_flush()
    return {span.name: span for span in exporter.get_finished_spans()}


def begin(traced: Tracing, exchange: Exchange, headers: list[tuple[bytes, bytes]]) -> None:
    wall_ns = int(exchange.wall_time.timestamp() * 1e9)
    exchange.trace = traced.begin(headers, "POST /v1/chat/completions", exchange.started, wall_ns)


async def test_spans_run_between_the_lifecycle_points_and_upstream_names_its_span(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    traced, exporter = tracing()
    recorder = recording(nursery)
    exchange = Exchange("POST", "/v1/chat/completions", model="peer/chat")
    client = f"00-{TRACE}-{PARENT}-01".encode()
    begin(traced, exchange, [(b"traceparent", client), (b"tracestate", b"k=v")])
    await trio.sleep(0.5)
    assert exchange.trace is not None
    upstream = [(b"traceparent", client), (b"content-type", b"application/json")]
    exchange.trace.sent(upstream, trio.current_time(), None)
    await trio.sleep(1.25)
    exchange.answer(b'data: {"choices": []}\n\n')
    exchange.status = 200
    await trio.sleep(2.0)
    exchange.finished = True
    record = recorder.finish(exchange)
    spans = finished(traced, exporter)
    names = {"POST /v1/chat/completions", "upstream", "time to first byte", "streaming"}
    assert set(spans) == names
    request = spans["POST /v1/chat/completions"]
    assert request.kind is SpanKind.SERVER
    assert request.parent is not None
    assert f"{request.parent.span_id:016x}" == PARENT
    assert f"{request.context.trace_id:032x}" == TRACE
    assert request.context.trace_state.get("k") == "v"

    def at(span: str) -> tuple[float, float]:
        start, end = spans[span].start_time, spans[span].end_time
        assert start is not None
        assert end is not None
        assert request.start_time is not None
        return (start - request.start_time) / 1e9, (end - request.start_time) / 1e9

    assert at("POST /v1/chat/completions") == (0.0, 3.75)
    assert at("upstream") == (0.5, 3.75)
    assert at("time to first byte") == (0.5, 1.75)
    assert at("streaming") == (1.75, 3.75)
    # The request upstream carries one traceparent: the upstream span's, in the client's
    # trace; the other fields as they were.
    sent = spans["upstream"].context
    fields = dict(upstream)
    assert len(upstream) == 3
    assert fields[b"traceparent"] == f"00-{TRACE}-{sent.span_id:016x}-01".encode()
    assert fields[b"tracestate"] == b"k=v"
    assert fields[b"content-type"] == b"application/json"
    assert request.attributes is not None
    assert request.attributes["llamaswap.activity_id"] == record.id
    assert request.attributes["llamaswap.model"] == "peer/chat"
    assert request.status.status_code is StatusCode.UNSET


async def test_a_client_that_leaves_mid_stream_ends_its_request_and_stream_in_error(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    traced, exporter = tracing()
    recorder = recording(nursery)
    exchange = Exchange("POST", "/v1/chat/completions", model="chat")
    begin(traced, exchange, [(b"traceparent", b"00-not-a-valid-one")])
    assert exchange.trace is not None
    exchange.trace.sent([], trio.current_time(), None)
    await trio.sleep(0.1)
    exchange.answer(b"data: {}\n\n")
    exchange.status = 200
    await trio.sleep(1.0)
    exchange.error = CLIENT_LEFT
    recorder.finish(exchange)
    spans = finished(traced, exporter)
    request = spans["POST /v1/chat/completions"]
    assert request.parent is None  # an invalid traceparent is ignored: a trace of its own
    for name in ("POST /v1/chat/completions", "upstream", "streaming"):
        assert spans[name].status.status_code is StatusCode.ERROR, name
        assert spans[name].status.description == CLIENT_LEFT
    assert spans["time to first byte"].status.status_code is StatusCode.UNSET


async def test_an_unsampled_request_sends_no_spans_but_still_passes_its_trace_on(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    exporter = InMemorySpanExporter()
    traced = open_tracing(TracingConfig(sample_ratio=0.0), exporter=exporter)
    assert traced is not None
    recorder = recording(nursery)
    exchange = Exchange("POST", "/v1/chat/completions", model="chat")
    begin(traced, exchange, [])
    assert exchange.trace is not None
    upstream: list[tuple[bytes, bytes]] = []
    exchange.trace.sent(upstream, trio.current_time(), None)
    exchange.status = 200
    recorder.finish(exchange)
    assert finished(traced, exporter) == {}
    [(name, value)] = upstream
    assert name == b"traceparent"
    flags = int(value.rsplit(b"-", 1)[1], 16)
    assert flags & 1 == 0, value  # the sampled flag is off: the model server is told so
