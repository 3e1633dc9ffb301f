"""What the gateway knows of each node: its address, and its figures as last scraped.

A node's ``/gateway/metrics`` (issue 30 §1) speaks vLLM's names, as a GIE endpoint
picker expects: the queue, the requests running, the KV cache's use, and the models
resident or loading as LoRA adapters. ``/v1/models`` says which models it serves at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Endpoint", "Figures", "Node", "parse_figures", "parse_models"]

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
ADAPTERS = "vllm:lora_requests_info"


@attrs.frozen
class Endpoint:
    """One node as ``endpoints.yaml`` names it."""

    name: str
    address: str
    port: int
    #: Where its metrics are scraped, when not on ``port``.
    metrics_port: int | None = None

    @property
    def target(self) -> str:
        """``ip:port``, as Envoy's original-destination cluster reads it."""
        return f"{_host(self.address)}:{self.port}"

    @property
    def url(self) -> str:
        """Where it serves (``/v1/models``)."""
        return f"http://{_host(self.address)}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Where its ``/gateway/metrics`` is."""
        return f"http://{_host(self.address)}:{self.metrics_port or self.port}/gateway/metrics"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@attrs.frozen
class Figures:
    """One scrape of a node's ``/gateway/metrics``."""

    waiting: int
    running: int
    kv_usage: float
    #: Models ready on the node (vLLM's running adapters).
    resident: frozenset[str]
    #: Models loading, or with requests queued for a load (waiting adapters).
    loading: frozenset[str]
    #: How many models it can keep resident at once (``max_lora``).
    capacity: int

    def has_room(self) -> bool:
        """Whether one more model can load without another one stopping."""
        return len(self.resident | self.loading) < self.capacity


@attrs.frozen
class Node:
    """An endpoint and what its scrapes have said; replaced whole after each scrape."""

    endpoint: Endpoint
    figures: Figures | None = None
    #: The models it serves (its ``/v1/models``); None until first read.
    models: frozenset[str] | None = None
    #: When its figures were scraped (``time.monotonic()``).
    scraped_at: float = -math.inf
    #: Scrapes failed since the last good one.
    failures: int = 0

    @property
    def name(self) -> str:
        return self.endpoint.name


def parse_figures(text: str) -> Figures:
    """The figures in a ``/gateway/metrics`` exposition.

    Raises:
        ValueError: it is not the text format, or a series is missing or out of range.
    """
    values: dict[str, float] = {}
    adapters: tuple[float, dict[str, str]] | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ADAPTERS:
                # As GIE's pickers read it: the series with the latest time wins.
                if adapters is None or sample.value > adapters[0]:
                    adapters = (sample.value, sample.labels)
            elif sample.name in (WAITING, RUNNING, KV_USAGE):
                values[sample.name] = sample.value
    missing = [name for name in (WAITING, RUNNING, KV_USAGE) if name not in values]
    if adapters is None:
        missing.append(ADAPTERS)
    if missing:
        raise ValueError(f"no {', '.join(missing)} in the node's metrics")
    assert adapters is not None
    labels = adapters[1]
    try:
        capacity = int(labels.get("max_lora", ""))
    except ValueError:
        raise ValueError(f"{ADAPTERS}'s max_lora is not a number") from None
    figures = Figures(
        waiting=int(values[WAITING]),
        running=int(values[RUNNING]),
        kv_usage=values[KV_USAGE],
        resident=_names(labels.get("running_lora_adapters", "")),
        loading=_names(labels.get("waiting_lora_adapters", "")),
        capacity=capacity,
    )
    if min(figures.waiting, figures.running, figures.capacity) < 0 or not (
        0 <= figures.kv_usage <= 1
    ):
        raise ValueError(f"a figure is out of range: {figures}")
    return figures


def _names(listed: str) -> frozenset[str]:
    return frozenset(name for name in listed.split(",") if name)


def parse_models(document: object) -> frozenset[str]:
    """The model IDs in a ``/v1/models`` answer.

    Raises:
        ValueError: it is not an OpenAI model list.
    """
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ValueError("the node's /v1/models is not a list of models")
    return frozenset(_ids(data))


def _ids(entries: Iterable[object]) -> Iterable[str]:
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            yield entry["id"]
