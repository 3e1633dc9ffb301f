"""``/gateway/metrics``' figures and text as pure code (the node, as a picker reads it)."""

from __future__ import annotations

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llamaswap.config import loads_config
from llamaswap.config.model import Config, GroupConfig, MatrixConfig
from llamaswap.gateway.nodes import parse_figures
from llamaswap.observability.model_server import (
    NodeFigures,
    exposition,
    kv_figure,
    node_figures,
    resident_capacity,
)
from llamaswap.process import ModelState, ModelStatistics
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.router.swappers.matrix import MatrixSwapper
from llamaswap.schedulers import SchedulerStatistics, Swapper
from tests.unit.ports import every_port_free

TOGETHER = GroupConfig(members=("a", "b", "c"), swap=False)
MATRIX = MatrixConfig(vars={m: m for m in "abcd"}, sets={"pair": "a & b", "trio": "b & c & d"})


@pytest.mark.parametrize(
    ("swapper", "capacity"),
    [
        (GroupSwapper({}), 1),  # one model at a time
        (GroupSwapper({"g": GroupConfig(members=("a", "b"), swap=False)}), 2),
        (GroupSwapper({"g": TOGETHER, "solo": GroupConfig(members=("d",))}), 3),
        (MatrixSwapper(MATRIX), 2),  # a first: a & b (b & c & d is not reached that way)
    ],
)
def test_max_lora_is_how_many_models_run_together_in_config_order(
    swapper: Swapper, capacity: int
) -> None:
    assert resident_capacity(swapper, ["a", "b", "c", "d"]) == capacity


@attrs.define
class FakeScheduler:
    waiting: int = 0
    loading: int = 0

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics("serial", self.waiting, self.loading, (), {})


@attrs.define
class FakeNode:
    config: Config
    states: dict[str, tuple[ModelState, int, int]]  # state, in flight, waiting
    scheduler: FakeScheduler = attrs.field(factory=lambda: FakeScheduler(1, 2))
    swapper: Swapper = attrs.field(factory=lambda: GroupSwapper({}))  # Source's, unused

    def known_models(self) -> list[str]:
        return list(self.states)

    def statistics(self, model: str) -> ModelStatistics:
        state, in_flight, _ = self.states[model]
        return ModelStatistics(model, state, None, in_flight, 0, 0, 0, None, None, 0.0)

    def waiting(self, model: str) -> int:
        return self.states[model][2]


def node_config(slots: str = "") -> Config:
    text = f"""
[routing.scheduler]
use = "serial"
[routing.scheduler.settings.serial]
slots = 4
[models.a]
cmd = "x ${{PORT}}"
{slots}
[models.b]
cmd = "x ${{PORT}}"
[models.c]
cmd = "x ${{PORT}}"
[models.d]
cmd = "x ${{PORT}}"
"""
    return loads_config(text, free=every_port_free)


def test_figures_count_what_the_router_knows() -> None:
    node = FakeNode(
        node_config("slots = 2"),
        {
            "a": (ModelState.READY, 1, 0),  # 1 of 2 slots busy
            "b": (ModelState.STARTING, 0, 2),
            "c": (ModelState.STOPPED, 0, 1),  # queued for a load
            "d": (ModelState.STOPPED, 0, 0),
        },
    )
    figures = node_figures(node, {}, 1)
    assert figures == NodeFigures(  # waiting: 1 queued and 2 joined to a load
        waiting=3, running=1, kv_usage=0.5, resident=["a"], loading=["b", "c"], capacity=1
    )


def test_the_kv_figure_is_the_servers_own_where_known_else_busy_slots() -> None:
    node = FakeNode(
        node_config(),
        {"a": (ModelState.READY, 1, 0), "b": (ModelState.READY, 3, 0)},  # 1/4, 3/4 busy
    )
    assert node_figures(node, {}, 1).kv_usage == 0.75
    assert node_figures(node, {"b": 0.1}, 1).kv_usage == 0.25  # a's slots, the fuller
    assert node_figures(node, {"a": 0.9, "b": 0.1}, 1).kv_usage == 0.9


def test_the_text_is_the_four_series_once_each_as_a_picker_parses_them() -> None:
    figures = NodeFigures(2, 1, 0.25, ["a", 'we"ird\\name'], ["c"], 3)
    text = exposition(figures, 1_800_000_000.5).decode()
    samples = {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert sorted(samples) == [
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ]
    info = samples["vllm:lora_requests_info"]
    assert info.labels == {
        "running_lora_adapters": 'a,we"ird\\name',
        "waiting_lora_adapters": "c",
        "max_lora": "3",
    }
    assert info.value == 1_800_000_000.5
    # ... and the gateway's own reader agrees.
    read = parse_figures(text)
    assert (read.waiting, read.running, read.kv_usage, read.capacity) == (2, 1, 0.25, 3)
    assert read.resident == {"a", 'we"ird\\name'}


@pytest.mark.parametrize(
    ("text", "figure"),
    [
        ("llamacpp:kv_cache_usage_ratio 0.42\nllamacpp:requests_processing 1\n", 0.42),
        ('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3\n', 0.3),
        ("vllm:gpu_cache_usage_perc 0.2\n", 0.2),
        ("vllm:kv_cache_usage_perc 1.5\n", 1.0),  # clamped
        ("vllm:num_requests_running 3\n", None),
        ("<html>not metrics</html>", None),
    ],
)
def test_a_servers_own_kv_figure(text: str, figure: float | None) -> None:
    assert kv_figure(text) == figure
