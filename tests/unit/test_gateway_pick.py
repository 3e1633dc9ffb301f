"""The gateway's pure parts: a node's figures, endpoints.yaml, and the pick."""

from __future__ import annotations

import pytest

from llamaswap.errors import ConfigError
from llamaswap.gateway.endpoints import parse_endpoints
from llamaswap.gateway.nodes import Endpoint, Figures, Node, parse_figures, parse_models
from llamaswap.gateway.pick import Policy, Reason, pick

EXPOSITION = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc 0.25
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="1",running_lora_adapters="old",waiting_lora_adapters=""} 1.6e9
"""


def test_figures_are_read_from_the_series_a_picker_reads() -> None:
    figures = parse_figures(EXPOSITION)
    assert figures == Figures(
        waiting=3, running=1, kv_usage=0.25,
        resident=frozenset({"a", "b"}), loading=frozenset(), capacity=2,
    )  # fmt: skip
    assert not figures.has_room()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("vllm:num_requests_running 1.0\n", ""), "no vllm:num_requests_running"),
        (("0.25", "1.5"), "out of range"),
        (('max_lora="2"', 'max_lora="two"'), "max_lora is not a number"),
    ],
)
def test_figures_that_cannot_be_used_are_refused(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_figures(EXPOSITION.replace(*change))


def test_models_are_the_ids_of_an_openai_list() -> None:
    document = {"object": "list", "data": [{"id": "a"}, {"id": "b"}, {"name": "no id"}]}
    assert parse_models(document) == {"a", "b"}
    with pytest.raises(ValueError, match="not a list"):
        parse_models({"data": "nope"})


def test_endpoints_file_in_llm_d_format() -> None:
    text = """
endpoints:
  - name: gpu-1
    address: 10.0.0.1
    port: "8080"
  - name: gpu-2
    address: fd00::2
    port: 8080
    metricsPort: "9090"
"""
    one, two = parse_endpoints(text, "endpoints.yaml")
    assert one == Endpoint("gpu-1", "10.0.0.1", 8080)
    assert (one.target, one.metrics_url) == (
        "10.0.0.1:8080",
        "http://10.0.0.1:8080/gateway/metrics",
    )
    assert two.metrics_url == "http://[fd00::2]:9090/gateway/metrics"
    assert (two.url, two.target) == ("http://[fd00::2]:8080", "[fd00::2]:8080")


def test_every_problem_in_an_endpoints_file_is_named_with_its_key_path() -> None:
    text = """
endpoints:
  - name: gpu-1
    address: 10.0.0.1
    port: "99999"
    metricPort: 1
  - name: gpu-1
    address: gpu.lan
    port: 80
  - "just a string"
"""
    with pytest.raises(ConfigError) as caught:
        parse_endpoints(text, "endpoints.yaml")
    problems = {(p.path, p.message) for p in caught.value.problems}
    assert problems == {
        ("endpoints[0].port", "must be a port (1-65535)"),
        ("endpoints[0].metricPort", "unknown key; did you mean 'metricsPort'?"),
        ("endpoints[1].address", "must be an IP address (Envoy routes to ip:port), got 'gpu.lan'"),
        ("endpoints[2]", "must be a table of name, address, port"),
    }
    with pytest.raises(ConfigError, match="must be a list of endpoints"):
        parse_endpoints("nodes: []", "endpoints.yaml")
    with pytest.raises(ConfigError, match="is not YAML"):
        parse_endpoints("endpoints: [", "endpoints.yaml")


def test_two_endpoints_of_one_name_are_a_problem() -> None:
    text = (
        "endpoints: [{name: a, address: 10.0.0.1, port: 1}, {name: a, address: 10.0.0.2, port: 1}]"
    )
    with pytest.raises(ConfigError, match=r"endpoints\[1\].name: 'a' names two endpoints"):
        parse_endpoints(text, "endpoints.yaml")


# The pick. Nodes are scraped at 0 unless said; now is 0.1 (fresh under the default policy).

NOW = 0.1
POLICY = Policy(stale_after=0.25, down_after=3, spread_depth=4)
INTERACTIVE, NORMAL, BATCH = 100, 0, -100


def node(
    name: str,
    *,
    resident: str = "",
    loading: str = "",
    capacity: int = 1,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    models: str = "a,b,c",
    scraped_at: float = 0.0,
    failures: int = 0,
) -> Node:
    figures = Figures(waiting, running, kv, names(resident), names(loading), capacity)
    endpoint = Endpoint(name, "10.0.0.1", 8080)
    return Node(endpoint, figures, names(models), scraped_at, failures)


def names(listed: str) -> frozenset[str]:
    return frozenset(filter(None, listed.split(",")))


def choose(
    nodes: list[Node], model: str | None = "a", priority: int = NORMAL, **pending: int
) -> tuple[str, Reason] | None:
    chosen = pick(nodes, model, priority, now=NOW, policy=POLICY, pending=pending)
    return None if chosen is None else (chosen.node.name, chosen.reason)


def test_a_node_with_the_model_loaded_beats_one_loading_it_beats_room_beats_eviction() -> None:
    evicts = node("evicts", resident="b")
    room = node("room", resident="b", capacity=2)
    loading = node("loading", loading="a", waiting=3)
    loaded = node("loaded", resident="a", waiting=3, running=1)
    assert choose([evicts, room, loading, loaded]) == ("loaded", Reason.LOADED)
    assert choose([evicts, room, loading]) == ("loading", Reason.LOADING)
    assert choose([evicts, room]) == ("room", Reason.ROOM)
    assert choose([evicts, node("busier", resident="c", waiting=1)]) == (
        "evicts", Reason.LEAST_LOADED,
    )  # fmt: skip


def test_within_a_tier_the_shortest_queue_then_fewest_running_then_emptiest_cache() -> None:
    nodes = [
        node("deep", resident="a", waiting=2),
        node("busy", resident="a", waiting=1, running=2),
        node("full", resident="a", waiting=1, running=1, kv=0.9),
        node("best", resident="a", waiting=1, running=1, kv=0.1),
    ]
    assert choose(nodes) == ("best", Reason.LOADED)


def test_picks_since_the_last_scrape_count_in_the_queue() -> None:
    nodes = [node("one", resident="a", waiting=1), node("two", resident="a", waiting=2, running=1)]
    assert choose(nodes, one=1) == ("one", Reason.LOADED)  # queues of 2 each: "one" runs less
    assert choose(nodes, one=2) == ("two", Reason.LOADED)


def test_stale_figures_rank_a_node_lower_in_its_tier_but_never_exclude_it() -> None:
    stale = node("stale", resident="a", scraped_at=NOW - 1)
    fresh = node("fresh", resident="a", waiting=3)
    assert choose([stale, fresh]) == ("fresh", Reason.LOADED)
    assert choose([stale, node("room", capacity=2)]) == ("stale", Reason.LOADED)
    assert choose([stale]) == ("stale", Reason.LOADED)


def test_a_node_whose_scrapes_fail_is_routed_around_and_one_never_scraped_is_not_picked() -> None:
    down = node("down", resident="a", failures=3)
    flaky = node("flaky", resident="a", failures=2)
    unseen = Node(Endpoint("unseen", "10.0.0.9", 8080))
    assert choose([down, unseen, node("room", capacity=2)]) == ("room", Reason.ROOM)
    assert choose([down, flaky]) == ("flaky", Reason.LOADED)
    assert choose([down, unseen]) is None
    assert choose([]) is None


def test_only_nodes_that_serve_the_model_are_candidates() -> None:
    other = node("other", resident="", capacity=4, models="b")
    serves = node("serves", resident="b", waiting=9)
    assert choose([other, serves]) == ("serves", Reason.LEAST_LOADED)


def test_a_model_no_node_lists_or_no_model_goes_to_the_least_loaded_node() -> None:
    nodes = [node("busy", resident="a", waiting=2), node("idle", resident="b")]
    assert choose(nodes, model="alias-of-a") == ("idle", Reason.LEAST_LOADED)
    assert choose(nodes, model=None) == ("idle", Reason.LEAST_LOADED)


def test_interactive_work_stays_where_the_model_is_loaded_however_deep_the_queue() -> None:
    nodes = [node("loaded", resident="a", waiting=9), node("idle", capacity=2)]
    assert choose(nodes, priority=INTERACTIVE) == ("loaded", Reason.LOADED)
    assert choose(nodes, priority=1000) == ("loaded", Reason.LOADED)


def test_other_work_spreads_from_a_deep_queue_to_a_node_loading_it_then_an_idle_one() -> None:
    loaded = node("loaded", resident="a", waiting=4)
    idle = node("idle", capacity=2)
    assert choose([loaded, idle], priority=BATCH) == ("idle", Reason.ROOM)
    assert choose([loaded, idle], priority=NORMAL) == ("idle", Reason.ROOM)
    assert choose([node("loaded", resident="a", waiting=3), idle], priority=BATCH) == (
        "loaded", Reason.LOADED,
    )  # fmt: skip
    loading = node("loading", loading="a", waiting=1, capacity=2)
    assert choose([loaded, idle, loading], priority=BATCH) == ("loading", Reason.LOADING)
    # ... until its queue is as deep: then the idle node.
    assert choose([loaded, idle, loading], priority=BATCH, loading=3) == ("idle", Reason.ROOM)


def test_spreading_never_goes_to_a_busy_node_or_one_that_would_evict() -> None:
    loaded = node("loaded", resident="a", waiting=5)
    busy_room = node("busy", capacity=2, running=1)
    full = node("full", resident="b")
    assert choose([loaded, busy_room, full], priority=BATCH) == ("loaded", Reason.LOADED)
