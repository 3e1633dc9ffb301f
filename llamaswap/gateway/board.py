"""The nodes as last scraped, shared by the scrapers and the picker.

The scrapers run in Trio's thread and the picker in gRPC's (design.md, "The gateway's
two threads"): **every read and write of the board holds its one lock, and a node's
entry is replaced whole, never changed in place.** A pick and the count of picks sent
since its node's last scrape change together, under that lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import attrs
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .nodes import Endpoint, Figures, Node
from .pick import Pick, Policy, Reason, pick

__all__ = ["Board", "GatewayMetrics"]

log = logging.getLogger("llamaswap.gateway")


class GatewayMetrics:
    """The gateway's own ``/metrics``."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.picks = Counter(
            "llamaswap_gateway_picks", "Requests placed on a node, by why that node.",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.unavailable = Counter(
            "llamaswap_gateway_unavailable",
            "Requests answered 503: no node up.", registry=registry,
        )  # fmt: skip
        self.served = Counter(
            "llamaswap_gateway_served", "Answers by the endpoint Envoy reports served them.",
            ["endpoint"], registry=registry,
        )  # fmt: skip
        self.scrape_errors = Counter(
            "llamaswap_gateway_scrape_errors", "Failed scrapes of a node's metrics.",
            ["endpoint"], registry=registry,
        )  # fmt: skip
        for reason in Reason:
            self.picks.labels(reason.value)


class Board:
    """Every node's latest figures, and the picks sent to it since."""

    def __init__(
        self,
        policy: Policy,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, Node] = {}
        self._pending: dict[str, int] = {}
        metrics.registry.register(_Up(self))

    def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """The endpoints to pick from now: a node kept keeps its figures."""
        with self._lock:
            old = self._nodes
            self._nodes = {
                e.name: old[e.name] if e.name in old and old[e.name].endpoint == e else Node(e)
                for e in endpoints
            }
            self._pending = {name: self._pending.get(name, 0) for name in self._nodes}

    def nodes(self) -> tuple[Node, ...]:
        with self._lock:
            return tuple(self._nodes.values())

    def scraped(self, endpoint: Endpoint, figures: Figures, models: frozenset[str]) -> None:
        """A good scrape of ``endpoint``: its figures now count every pick sent before."""
        with self._lock:
            node = self._nodes.get(endpoint.name)
            if node is None or node.endpoint != endpoint:
                return  # removed from the list while it was scraped
            if node.failures >= self.policy.down_after:
                log.warning("node %s is up again", endpoint.name)
            self._nodes[endpoint.name] = Node(endpoint, figures, models, self._clock())
            self._pending[endpoint.name] = 0

    def failed(self, endpoint: Endpoint, why: str) -> None:
        """A failed scrape of ``endpoint``."""
        self.metrics.scrape_errors.labels(endpoint.name).inc()
        with self._lock:
            node = self._nodes.get(endpoint.name)
            if node is None or node.endpoint != endpoint:
                return
            self._nodes[endpoint.name] = attrs.evolve(node, failures=node.failures + 1)
            if node.failures + 1 == self.policy.down_after:
                log.warning("node %s is down, routed around: %s", endpoint.name, why)

    def choose(self, model: str | None, priority: int) -> Pick | None:
        """Where a request goes (None: no node is up), counted as sent there."""
        with self._lock:
            chosen = pick(
                tuple(self._nodes.values()), model, priority,
                now=self._clock(), policy=self.policy, pending=self._pending,
            )  # fmt: skip
            if chosen is not None:
                self._pending[chosen.node.name] += 1
        if chosen is None:
            self.metrics.unavailable.inc()
        else:
            self.metrics.picks.labels(chosen.reason.value).inc()
        return chosen

    def models(self) -> list[str]:
        """Every model a node that is up serves, sorted."""
        up = [node for node in self.nodes() if self.policy.is_up(node)]
        return sorted(set().union(*(node.models or () for node in up)))


class _Up(Collector):
    """What the board holds of each node, read at each scrape of the gateway's metrics."""

    def __init__(self, board: Board) -> None:
        self._board = board

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "llamaswap_gateway_node_up",
            "1 while a node is picked from (scraped, and not down).", labels=["endpoint"],
        )  # fmt: skip
        waiting = GaugeMetricFamily(
            "llamaswap_gateway_node_waiting", "A node's queue as last scraped.",
            labels=["endpoint"],
        )  # fmt: skip
        resident = GaugeMetricFamily(
            "llamaswap_gateway_node_model_resident",
            "1 for each model ready on a node, as last scraped.", labels=["endpoint", "model"],
        )  # fmt: skip
        for node in self._board.nodes():
            figures = node.figures
            up.add_metric([node.name], float(self._board.policy.is_up(node)))
            if figures is not None:
                waiting.add_metric([node.name], figures.waiting)
                for model in sorted(figures.resident):
                    resident.add_metric([node.name, model], 1.0)
        yield from (up, waiting, resident)
