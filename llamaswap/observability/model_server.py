"""``/gateway/metrics``: this llamaswap as a Gateway API Inference Extension picker reads
a model server (issue 30 §1, docs/scale-out.md).

A GIE endpoint picker (llm-d's, or ``llamaswap gateway``) scrapes each model server for
vLLM's series. A llamaswap node answers with those names, so a stock picker needs no
configuration, and each of its models stands for a LoRA adapter: the picker's adapter
affinity is then model locality.

* ``vllm:num_requests_waiting``: requests waiting in this node's scheduler: queued, or
  joined to a load in progress (not served yet either way);
* ``vllm:num_requests_running``: requests being served;
* ``vllm:kv_cache_usage_perc`` (a fraction, as vLLM's): the fullest ready model's KV
  cache, as its server reports it (llama-server ``--metrics``, vLLM), else its busy
  slots ÷ its slots;
* ``vllm:lora_requests_info``: the ready models as ``running_lora_adapters``, those
  loading or queued for a load as ``waiting_lora_adapters``, and in ``max_lora`` how
  many models the node can keep resident at once; its value is the time of the scrape,
  as vLLM sets it (a picker reads the latest series).

**Each is exactly one series, computed from the router at scrape time** (nothing is kept
that could drift). Only the servers' own KV figures are read beforehand: in node mode,
``ModelServerMetrics.run`` asks each ready model's ``/metrics`` once a second, since a scrape every
50 ms cannot wait on a model server.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs
import trio
from prometheus_client.parser import text_string_to_metric_families

from llamaswap.config import Config
from llamaswap.http.client import UpstreamFailed, UpstreamPool
from llamaswap.process import ModelState, ModelStatistics
from llamaswap.schedulers import SchedulerStatistics, Swapper
from llamaswap.schedulers.settings import concurrency

__all__ = [
    "ModelServerMetrics",
    "NodeFigures",
    "exposition",
    "kv_figure",
    "node_figures",
    "resident_capacity",
]

logger = logging.getLogger("llamaswap.observability")

#: The KV-cache figures a model server may export, in the order they are looked for.
KV_NAMES = (
    "llamacpp:kv_cache_usage_ratio",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
)
#: How often the ready models' own KV figures are read.
KV_EVERY = 1.0
#: A model server that takes longer to answer its ``/metrics`` has no figure this time.
KV_TIMEOUT = 0.5
#: Bytes of a model server's ``/metrics`` read at most; a larger answer says nothing.
KV_LIMIT = 1024 * 1024


class _Queue(Protocol):
    def statistics(self) -> SchedulerStatistics: ...


class Source(Protocol):
    """What the series are read from (the router)."""

    @property
    def config(self) -> Config: ...

    @property
    def scheduler(self) -> _Queue: ...

    @property
    def swapper(self) -> Swapper: ...

    def known_models(self) -> list[str]: ...

    def statistics(self, model: str) -> ModelStatistics: ...

    def waiting(self, model: str) -> int: ...


@attrs.frozen
class NodeFigures:
    waiting: int
    running: int
    kv_usage: float
    resident: Sequence[str]
    loading: Sequence[str]
    capacity: int


def node_figures(source: Source, kv: Mapping[str, float], capacity: int) -> NodeFigures:
    """The node's figures now; ``kv``: the ready models' own KV figures, where known;
    ``capacity``: ``max_lora``."""
    resident, loading = [], []
    running, usage = 0, 0.0
    queue = source.scheduler.statistics()
    for model in source.known_models():
        stats = source.statistics(model)
        running += stats.in_flight
        if stats.state is ModelState.READY:
            resident.append(model)
            busy = stats.in_flight / concurrency(source.config, model)
            usage = max(usage, kv.get(model, busy))
        elif stats.state is ModelState.STARTING or source.waiting(model) > 0:
            loading.append(model)
    return NodeFigures(
        waiting=queue.waiting + queue.loading,
        running=running,
        kv_usage=min(1.0, usage),
        resident=sorted(resident),
        loading=sorted(loading),
        capacity=capacity,
    )


def resident_capacity(swapper: Swapper, models: Sequence[str]) -> int:
    """How many of ``models`` run at once, as ``max_lora`` says it: each, in config
    order, joins the set when it runs beside the whole set (``Swapper.runs_beside``; at
    least 1).
    Taken in another order, a matrix may fit more together; config order is the one a
    reader of the config can check."""
    together: set[str] = set()
    for model in models:
        if swapper.runs_beside(model, together):
            together.add(model)
    return max(1, len(together))


def exposition(figures: NodeFigures, wall_now: float) -> bytes:
    """The four series in Prometheus' text format."""
    labels = ",".join(
        f'{name}="{_escape(value)}"'
        for name, value in (
            ("max_lora", str(figures.capacity)),
            ("running_lora_adapters", ",".join(figures.resident)),
            ("waiting_lora_adapters", ",".join(figures.loading)),
        )
    )
    return (
        _gauge("vllm:num_requests_waiting", "Requests queued in the node's scheduler.",
               f"vllm:num_requests_waiting {figures.waiting}")
        + _gauge("vllm:num_requests_running", "Requests being served.",
                 f"vllm:num_requests_running {figures.running}")
        + _gauge("vllm:kv_cache_usage_perc", "KV cache use of the fullest ready model (0-1).",
                 f"vllm:kv_cache_usage_perc {figures.kv_usage!r}")
        + _gauge("vllm:lora_requests_info",
                 "Models ready (running) and loading (waiting), as LoRA adapters.",
                 f"vllm:lora_requests_info{{{labels}}} {wall_now!r}")
    ).encode()  # fmt: skip


def _gauge(name: str, help_text: str, sample: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{sample}\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@attrs.define(eq=False)
class ModelServerMetrics:
    """``/gateway/metrics`` of one llamaswap: the series, what they need kept between
    scrapes (``max_lora``, found again when a reload changes the swapper), and the ready
    models' own KV-cache figures, read from their servers' ``/metrics`` by ``run``.

    A model whose server has none of ``KV_NAMES`` (or no ``/metrics``) is not asked again
    until its next start; then its busy slots stand for it.
    """

    source: Source
    pool: UpstreamPool
    kv: dict[str, float] = attrs.field(factory=dict)
    #: The servers found without a figure: each model's PID then.
    _without: dict[str, int | None] = attrs.field(factory=dict)
    _capacity: tuple[Swapper, int] | None = None

    def exposition(self, wall_now: float) -> bytes:
        """The series now (``wall_now``: Unix time)."""
        swapper = self.source.swapper
        if self._capacity is None or self._capacity[0] is not swapper:
            models = list(self.source.config.models)
            self._capacity = (swapper, resident_capacity(swapper, models))
        return exposition(node_figures(self.source, self.kv, self._capacity[1]), wall_now)

    async def run(self) -> None:
        """Read the figures every ``KV_EVERY`` seconds until cancelled, in node mode only
        (``[gateway] node``): elsewhere no picker reads them."""
        while True:
            started = trio.current_time()
            ready = {}
            for model in self.source.known_models() if self.source.config.gateway.node else ():
                stats = self.source.statistics(model)
                if stats.state is ModelState.READY and self._without.get(model, -1) != stats.pid:
                    ready[model] = stats
            self.kv = {m: f for m, f in self.kv.items() if m in ready}
            for model, stats in ready.items():
                figure = await self._read(model)
                if figure is None:
                    self.kv.pop(model, None)
                    self._without[model] = stats.pid
                else:
                    self.kv[model] = figure
            await trio.sleep_until(started + KV_EVERY)

    async def _read(self, model: str) -> float | None:
        proxy = self.source.statistics(model).address
        if proxy is None:
            return None
        with trio.move_on_after(KV_TIMEOUT):
            try:
                async with self.pool.request("GET", proxy, "/metrics", [], None) as response:
                    body = await response.read_at_most(KV_LIMIT)
                    status = response.status
            except UpstreamFailed:
                return None
            if status != 200 or body is None:
                return None
            return kv_figure(body.decode("utf-8", "replace"))
        return None


def kv_figure(text: str) -> float | None:
    """The KV-cache use a model server's ``/metrics`` reports (0-1), or None."""
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in KV_NAMES and math.isfinite(sample.value):
                    found.setdefault(sample.name, sample.value)
    except ValueError:  # not the text format
        return None
    for name in KV_NAMES:
        if name in found:
            return min(1.0, max(0.0, found[name]))
    return None
