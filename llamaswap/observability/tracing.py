"""OpenTelemetry traces of proxied requests (``[tracing]``, docs/tracing.md).

Each request through the forwarder is one SERVER span, with children for the phases it
went through::

    POST /v1/chat/completions           arrival → last byte (or failure)
    ├── admission wait                  arrival → dispatched (left the queue)
    ├── model load                      joined its model's load → granted
    └── upstream                        (CLIENT) first byte sent upstream → last byte
        ├── time to first byte          sent → the answer's first body byte
        └── streaming                   first body byte → last byte

**Nothing here runs per chunk.** The spans are built from the lifecycle points that the
activity record is built from (the ticket's arrival, dispatch, load and grant times, the
exchange's first byte), at two moments: when the request goes upstream (the request and
upstream spans must exist then: the model server is sent a ``traceparent`` naming the
upstream span) and when it has ended (``Recorder.finish``); the phases are then created
with their start and end times given. When ``[tracing]`` is off no ``RequestTrace`` exists
and nothing from OpenTelemetry is imported: the forwarder's cost is a few ``is None`` tests.

The SDK's ``BatchSpanProcessor`` sends spans from its own thread: ending a span only queues
it, so the event loop never waits on the collector. ``close`` flushes what is queued, and
``serve()`` gives it a bounded time in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, final

import attrs

from llamaswap._version import version
from llamaswap.config.model import TracingConfig
from llamaswap.config.validate import OTEL_MISSING, otel_installed
from llamaswap.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from llamaswap.observability.activity import ActivityRecord
    from llamaswap.router.lease import RequestInfo

__all__ = ["Phase", "RequestTrace", "Tracing", "open_tracing", "phases"]

ADMISSION = "admission wait"
LOAD = "model load"
UPSTREAM = "upstream"
TTFB = "time to first byte"
STREAMING = "streaming"
#: A phase's parent: the request's span, or the upstream one.
REQUEST = "request"

#: The W3C Trace Context fields: read from the client, replaced on the way upstream.
_TRACE_FIELDS = (b"traceparent", b"tracestate")
#: The service name when neither ``serviceName`` nor ``OTEL_SERVICE_NAME`` gives one.
SERVICE_NAME = "llamaswap"


@attrs.frozen
class Phase:
    """One child span: ``name`` from ``start`` to ``end`` (Trio clock seconds), under
    ``parent`` (``REQUEST`` or ``UPSTREAM``). ``open``: still going when the request ended
    (a failure there is this phase's)."""

    name: str
    start: float
    end: float
    parent: str = REQUEST
    open: bool = False


def phases(
    *,
    arrival: float | None,
    dispatched_at: float | None,
    joined_load_at: float | None,
    granted_at: float | None,
    sent: float | None,
    first_byte: float | None,
    end: float,
) -> list[Phase]:
    """The child spans of a request that ended at ``end``, from its lifecycle points.

    ``arrival``..``granted_at`` are its ticket's (None without one: a peer's request, or
    one refused before the scheduler); ``granted_at`` the first grant. ``sent``: when it
    went upstream, None if it never did; ``first_byte``: the answer's first body byte.
    """
    out: list[Phase] = []
    if arrival is not None:
        queued_until = end if dispatched_at is None else dispatched_at
        out.append(Phase(ADMISSION, arrival, queued_until, open=dispatched_at is None))
    # A load joined only after its first grant (a preempted request's) is not this span's.
    if joined_load_at is not None and (granted_at is None or joined_load_at <= granted_at):
        loaded = end if granted_at is None else granted_at
        out.append(Phase(LOAD, joined_load_at, loaded, open=granted_at is None))
    if sent is not None:
        out.append(Phase(UPSTREAM, sent, end, open=True))
        replied = end if first_byte is None else first_byte
        out.append(Phase(TTFB, sent, replied, UPSTREAM, open=first_byte is None))
        if first_byte is not None:
            out.append(Phase(STREAMING, first_byte, end, UPSTREAM, open=True))
    return out


def request_attributes(
    record: ActivityRecord, info: RequestInfo | None
) -> dict[str, str | int | float]:
    """The request span's attributes, from its activity record: what the activity log
    says about it, under OpenTelemetry's HTTP names where there is one."""
    attributes: dict[str, str | int | float] = {
        "http.request.method": record.method,
        "url.path": record.path,
        "http.response.status_code": record.status,
        "llamaswap.activity_id": record.id,
        "llamaswap.priority": record.priority,
        "llamaswap.band": record.band,
    }
    if record.model:
        attributes["llamaswap.model"] = record.model
    if record.request is not None:
        attributes["llamaswap.request_id"] = record.request
    if record.score is not None:
        attributes["llamaswap.score"] = record.score
    if record.scheduler is not None:
        attributes["llamaswap.scheduler"] = record.scheduler
    if record.error is not None:
        attributes["llamaswap.error"] = record.error
    if record.prompt_tokens:
        attributes["gen_ai.usage.input_tokens"] = record.prompt_tokens
    if record.completion_tokens:
        attributes["gen_ai.usage.output_tokens"] = record.completion_tokens
    if info is not None and info.preemptions:
        attributes["llamaswap.preemptions"] = info.preemptions
    return attributes


def failed(record: ActivityRecord) -> bool:
    """Whether the request span says ERROR: an error recorded (a refusal, a failed load, a
    broken upstream, a client that left, a request cancelled by an unload), or a 5xx."""
    return record.error is not None or record.status >= 500


@final
class Tracing:
    """The tracer, and what sends its spans: one per ``serve()``."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("llamaswap", version())
        self.propagator: TraceContextTextMapPropagator = TraceContextTextMapPropagator()

    def begin(
        self, headers: Iterable[tuple[bytes, bytes]], name: str, started: float, wall_ns: int
    ) -> RequestTrace:
        """A request's trace, begun at ``started`` (Trio clock; ``wall_ns`` the same moment
        in nanoseconds since the epoch); a child of the client's ``traceparent`` if it sent
        one (an invalid one is ignored, as W3C Trace Context says)."""
        carrier = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in headers
            if key in _TRACE_FIELDS
        }
        parent = self.propagator.extract(carrier) if carrier else None
        return RequestTrace(self, parent, name, started, wall_ns)

    def close(self, timeout: float) -> None:
        """Send the spans still queued, for at most about ``timeout`` seconds, and stop.
        Blocking: run it in a worker thread."""
        self.provider.force_flush(timeout_millis=int(timeout * 1000))
        self.provider.shutdown()


@final
class RequestTrace:
    """One request's spans. Made by ``Tracing.begin``; told when the request goes upstream
    (``sent``) and when it has ended (``finish``)."""

    def __init__(
        self, tracing: Tracing, parent: Context | None, name: str, started: float, wall_ns: int
    ) -> None:
        from opentelemetry.trace import SpanKind

        self._tracing = tracing
        self._started = started
        self._wall_ns = wall_ns
        self.span: Span = tracing.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, start_time=wall_ns
        )
        self.upstream: Span | None = None
        self._sent: float | None = None
        self._granted_at: float | None = None

    def _ns(self, moment: float) -> int:
        """A Trio clock time as OpenTelemetry's: nanoseconds since the epoch."""
        return self._wall_ns + round((moment - self._started) * 1e9)

    def sent(
        self, headers: list[tuple[bytes, bytes]], now: float, granted_at: float | None
    ) -> None:
        """The request goes upstream with ``headers`` (changed in place): its upstream span
        begins (at the first send; a resumed one's next segments are within it), and the
        request names it in ``traceparent`` (and carries the client's ``tracestate``)."""
        from opentelemetry import trace

        if self.upstream is None:
            self._sent = now
            self._granted_at = granted_at
            self.upstream = self._tracing.tracer.start_span(
                UPSTREAM,
                context=trace.set_span_in_context(self.span),
                kind=trace.SpanKind.CLIENT,
                start_time=self._ns(now),
            )
        carrier: dict[str, str] = {}
        self._tracing.propagator.inject(carrier, trace.set_span_in_context(self.upstream))
        headers[:] = [(k, v) for k, v in headers if k not in _TRACE_FIELDS]
        headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items())

    def finish(
        self,
        record: ActivityRecord,
        info: RequestInfo | None,
        first_byte: float | None,
        end: float,
    ) -> None:
        """The request ended at ``end`` as ``record`` says: its phases become spans, each
        span ends, and the batch processor has them (sent from its thread)."""
        if not self.span.is_recording():
            return  # not sampled: nothing is kept, so nothing is built
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        error = Status(StatusCode.ERROR, record.error or f"status {record.status}")
        is_failed = failed(record)
        granted_at = self._granted_at if self._sent is not None else None
        if info is not None and self._sent is None:
            granted_at = info.granted_at
        planned = phases(
            arrival=None if info is None else info.arrival,
            dispatched_at=None if info is None else info.dispatched_at,
            joined_load_at=None if info is None else info.joined_load_at,
            granted_at=granted_at,
            sent=self._sent,
            first_byte=first_byte,
            end=end,
        )
        parents: Mapping[str, Span | None] = {REQUEST: self.span, UPSTREAM: self.upstream}
        for phase in planned:
            if phase.name == UPSTREAM:
                span = self.upstream
                assert span is not None
            else:
                span = self._tracing.tracer.start_span(
                    phase.name,
                    context=trace.set_span_in_context(parents[phase.parent] or self.span),
                    start_time=self._ns(phase.start),
                )
            if is_failed and phase.open:
                span.set_status(error)
            span.end(end_time=self._ns(phase.end))
        self.span.set_attributes(request_attributes(record, info))
        if is_failed:
            self.span.set_status(error)
        self.span.end(end_time=self._ns(end))


#: What ``[tracing]`` says when OpenTelemetry is installed but does not import. The usual
#: cause: another package wrote over opentelemetry-proto's modules (the gateway extra's
#: xds-protos carries an old copy of them, and the last package pip installs owns the files).
OTEL_BROKEN = (
    "the OpenTelemetry packages are installed but do not import ({}); if another package "
    "(xds-protos, from llamaswap[gateway]) wrote over them, reinstall them last: "
    "pip install --force-reinstall --no-deps opentelemetry-proto"
)


def open_tracing(
    config: TracingConfig | None, *, exporter: SpanExporter | None = None
) -> Tracing | None:
    """The tracing ``config`` asks for; None when it is off (nothing imported).

    ``exporter``: where spans go (tests); by default OTLP over HTTP to ``endpoint``, else
    where the standard ``OTEL_EXPORTER_OTLP_*`` variables say.

    Raises:
        ConfigError: the ``otel`` extra is not installed.
    """
    if config is None or not config.enabled:
        return None
    if not otel_installed():
        raise ConfigError("<config>", [ConfigProblem("tracing", OTEL_MISSING)])
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME as SERVICE_NAME_KEY
        from opentelemetry.sdk.resources import SERVICE_VERSION, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as error:  # installed, but broken: say how to mend it
        problem = ConfigProblem("tracing", OTEL_BROKEN.format(error))
        raise ConfigError("<config>", [problem]) from error

    if exporter is None:
        if config.endpoint is not None:
            exporter = OTLPSpanExporter(endpoint=config.endpoint.rstrip("/") + "/v1/traces")
        else:
            exporter = OTLPSpanExporter()  # the OTEL_EXPORTER_OTLP_* variables, or localhost
    attributes: dict[str, str] = {SERVICE_VERSION: version()}
    if config.service_name is not None:
        attributes[SERVICE_NAME_KEY] = config.service_name
    elif not os.environ.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME_KEY] = SERVICE_NAME
    sampler = (
        None
        if config.sample_ratio is None
        else ParentBased(TraceIdRatioBased(config.sample_ratio))
    )
    # shutdown_on_exit=False: its atexit flush could wait on an unreachable collector for
    # as long as the exporter's timeout; serve() closes it, bounded, instead.
    provider = TracerProvider(
        sampler=sampler, resource=Resource.create(attributes), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider)
