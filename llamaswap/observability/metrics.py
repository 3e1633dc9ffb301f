"""``/metrics`` (SPEC §9.1) in the Prometheus text format, on a registry of our own.

Two kinds of series. Event counts and durations (requests, tokens, loads) are
``prometheus_client`` counters and histograms, updated as things happen. Everything that is
a *state* (queue depth and oldest wait by band, dispatches, preemptions, changed picks,
model states, in-flight requests) is read from ``statistics()`` snapshots at scrape time
by a collector, so the exposition can never drift from the scheduler. All five band labels
are always present. The scheduler's counters (dispatches, preemptions, changed picks) also
add the final counts of the schedulers a reload switched out (``Source.retired_counts``),
so they never go back.

A model the router forgets (a reload removed it, and it has stopped) leaves every series:
``forget`` removes its labelled children, and the collector reads only the supervisors
the router still has. **/metrics holds series for the configured models, the removed ones
not yet stopped, and peers; never for every model ever configured.**
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, TypeVar, cast, final

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from llamaswap.process import ModelState, ModelStatistics
from llamaswap.resources import Resources
from llamaswap.router.events import ModelForgotten, ModelStateChanged, RouterEvent
from llamaswap.schedulers import Scheduler, SchedulerCounts
from llamaswap.schedulers.priority import BANDS

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Source(Protocol):
    """Where the state series are read at each scrape (the router: its scheduler and
    supervisors may change on a reload)."""

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def retired_counts(self) -> SchedulerCounts:
        """The final counts of the schedulers a reload switched out."""

    def known_models(self) -> list[str]:
        """Every configured model, and a removed one not yet forgotten."""

    def statistics(self, model: str) -> ModelStatistics: ...

    @property
    def resources(self) -> Resources:
        """Devices and each model's memory (``/metrics``' GPU series)."""


@final
class Metrics:
    """Every series llamaswap exports."""

    def __init__(self, source: Source) -> None:
        self.registry = CollectorRegistry()
        self._source = source
        registry = self.registry
        self.requests = Counter(
            "llamaswap_requests", "Proxied requests by model and HTTP status.",
            ["model", "status"], registry=registry,
        )  # fmt: skip
        self.request_duration = Histogram(
            "llamaswap_request_duration_seconds", "Time from arrival to the last byte.",
            ["model"], buckets=_SECONDS, registry=registry,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "llamaswap_scheduler_queue_wait_seconds",
            "Time from arrival to dispatch (served, or its load started or joined).",
            ["band"], buckets=_SECONDS, registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "llamaswap_tokens", "Tokens reported in responses' usage, by model and kind.",
            ["model", "kind"], registry=registry,
        )  # fmt: skip
        self.loads = Counter(
            "llamaswap_model_loads", "Model starts by result: ready, failed or cancelled.",
            ["model", "result"], registry=registry,
        )  # fmt: skip
        self.load_duration = Histogram(
            "llamaswap_model_load_duration_seconds", "Time from start to ready.",
            ["model"], buckets=_SECONDS, registry=registry,
        )  # fmt: skip
        self.reloads = Counter(
            "llamaswap_config_reloads", "Configuration reloads by result: ok or failed.",
            ["result"], registry=registry,
        )  # fmt: skip
        self.last_reload = Gauge(
            "llamaswap_config_last_reload_success_timestamp_seconds",
            "When the configuration was last reloaded successfully (Unix time; 0: never).",
            registry=registry,
        )
        for result in ("ok", "failed"):
            self.reloads.labels(result)
        for band in BANDS:
            self.queue_wait.labels(band)
        registry.register(_Snapshots(source))
        #: The event series labelled by model, the model first.
        self._by_model: tuple[MetricWrapperBase, ...] = (
            self.requests, self.request_duration, self.tokens, self.loads, self.load_duration,
        )  # fmt: skip
        self._starting: dict[str, tuple[float, int]] = {}
        #: Each labelled series once found: prometheus-client's ``labels()`` takes a lock
        #: and converts its labels on every call (docs/performance.md, fourth pass).
        self._series: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}

    def series(self, metric: _Metric, *labels: str) -> _Metric:
        """``metric.labels(*labels)``, found once."""
        key = (metric, labels)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = metric.labels(*labels)
        return cast(_Metric, found)

    def knows(self, model: str) -> bool:
        """Whether the router has ``model`` (configured, or removed but not yet stopped)."""
        return model in self._source.known_models()

    def on_event(self, event: RouterEvent) -> None:
        """The router's events that the metrics count (a ``Router.observe`` observer)."""
        if isinstance(event, ModelStateChanged):
            self.on_model_state(event.model, event.state)
        elif isinstance(event, ModelForgotten):
            self.forget(event.model)

    def forget(self, model: str) -> None:
        """Drop every series of ``model``, which the router has forgotten."""
        for metric in self._by_model:
            metric.remove_by_labels({"model": model})
        self._series = {
            key: child
            for key, child in self._series.items()
            if not (key[0] in self._by_model and key[1][0] == model)
        }
        self._starting.pop(model, None)

    def on_model_state(self, model: str, state: ModelState) -> None:
        """Count loads from the supervisor's transitions."""
        now = trio.current_time()
        failures = self._source.statistics(model).start_failures
        if state is ModelState.STARTING:
            self._starting[model] = (now, failures)
            return
        started = self._starting.pop(model, None)
        if started is None:
            return
        if state is ModelState.READY:
            self.series(self.loads, model, "ready").inc()
            self.series(self.load_duration, model).observe(now - started[0])
        else:
            result = "failed" if failures > started[1] else "cancelled"
            self.series(self.loads, model, result).inc()

    def on_reload(self, ok: bool) -> None:
        """Count a reload; a successful one also sets the last-success time."""
        self.reloads.labels("ok" if ok else "failed").inc()
        if ok:
            self.last_reload.set_to_current_time()

    def exposition(self) -> bytes:
        for model in self._source.known_models():  # its series from the first scrape on
            self._declare(model)
        return generate_latest(self.registry)

    def _declare(self, model: str) -> None:
        """Every series of ``model`` whose labels are known before anything happens (not
        ``requests``, whose status is the answer's), so that rates and alerts never meet
        a missing series."""
        self.series(self.request_duration, model)
        self.series(self.load_duration, model)
        for result in ("ready", "failed", "cancelled"):
            self.series(self.loads, model, result)
        for kind in ("prompt", "completion"):
            self.series(self.tokens, model, kind)


@final
class _Snapshots(Collector):
    def __init__(self, source: Source) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        stats = self._source.scheduler.statistics()
        # A reload may have switched schedulers: the counters go on from the old ones'.
        counts = self._source.retired_counts + SchedulerCounts.of(stats)
        depth = GaugeMetricFamily(
            "llamaswap_scheduler_queue_depth", "Requests waiting, not yet dispatched.",
            labels=["band"],
        )  # fmt: skip
        oldest = GaugeMetricFamily(
            "llamaswap_scheduler_queue_oldest_wait_seconds",
            "How long the oldest waiting request has waited (0 when none waits).",
            labels=["band"],
        )
        dispatched = CounterMetricFamily(
            "llamaswap_scheduler_dispatch", "Requests dispatched, by band.", labels=["band"]
        )
        preempted = CounterMetricFamily(
            "llamaswap_scheduler_preemptions",
            "Serving requests checkpointed for more urgent work, by their band.",
            labels=["band"],
        )
        for band, numbers in stats.bands.items():
            depth.add_metric([band], numbers.depth)
            oldest.add_metric([band], numbers.oldest_wait)
            dispatched.add_metric([band], counts.dispatched[band])
            preempted.add_metric([band], counts.preempted.get(band, 0))
        yield from (depth, oldest, dispatched, preempted)
        yield CounterMetricFamily(
            "llamaswap_scheduler_aging_changed_pick",
            "Picks that would have gone to another request without the aging term.",
            value=counts.aging_changed_picks,
        )
        yield CounterMetricFamily(
            "llamaswap_scheduler_affinity_changed_pick",
            "Picks that would have gone to another request without swap affinity.",
            value=counts.affinity_changed_picks,
        )
        states = GaugeMetricFamily(
            "llamaswap_model_state", "1 for the state each model is in.",
            labels=["model", "state"],
        )  # fmt: skip
        in_flight = GaugeMetricFamily(
            "llamaswap_in_flight_requests", "Requests being served, by model.", labels=["model"]
        )
        for model in self._source.known_models():
            snapshot = self._source.statistics(model)
            for state in ModelState:
                states.add_metric([model, state.value], float(snapshot.state is state))
            in_flight.add_metric([model], snapshot.in_flight)
        yield from (states, in_flight)
        yield from _gpu_series(self._source.resources, self._source.known_models())


#: The GPU gauges: name, help, and the ``DeviceView`` field each reads.
_GPU_GAUGES = (
    ("llamaswap_gpu_memory_used_bytes", "GPU memory in use (every process).", "used"),
    ("llamaswap_gpu_memory_total_bytes", "GPU memory in all.", "total"),
    ("llamaswap_gpu_utilization_percent", "GPU busy time over the last sample period.",
     "utilization"),
    ("llamaswap_gpu_temperature_celsius", "GPU temperature.", "temperature"),
    ("llamaswap_gpu_power_watts", "GPU power draw.", "power"),
)  # fmt: skip


def _gpu_series(resources: Resources, models: list[str]) -> Iterator[Metric]:
    """The devices' gauges as last sampled (a GPU probe's only: without one, absent),
    each device's budget, and each model's memory: what it needs and what it holds."""
    devices = resources.devices()
    probed = [d for d in devices if d.name != "cpu" and d.used is not None]
    for name, help_text, field in _GPU_GAUGES:
        gauge = GaugeMetricFamily(name, help_text, labels=["device", "name"])
        for device in probed:
            value = getattr(device, field)
            if value is not None:
                gauge.add_metric([device.name, device.label], value)
        yield gauge
    budget = GaugeMetricFamily(
        "llamaswap_device_memory_budget_bytes",
        "What models may use on a device: its memory less headroom.", labels=["device"],
    )  # fmt: skip
    for device in devices:
        if device.budget is not None:
            budget.add_metric([device.name], device.budget)
    yield budget
    held = GaugeMetricFamily(
        "llamaswap_model_memory_bytes", "Memory a model's processes hold, by device.",
        labels=["model", "device"],
    )  # fmt: skip
    need = GaugeMetricFamily(
        "llamaswap_model_memory_need_bytes",
        "Memory a model needs by device, and where the figure comes from.",
        labels=["model", "device", "source"],
    )
    for model in models:
        memory = resources.memory(model)
        for name, size in memory.held.items():
            held.add_metric([model, name], size)
        if memory.need is not None:
            for name, size in memory.need.sizes.items():
                need.add_metric([model, name, memory.need.source], size)
    yield from (held, need)
