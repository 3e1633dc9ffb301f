"""The board the scrapers and the picker share, and the picker's answers to Envoy."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("grpc")

from llamaswap.gateway.board import Board, GatewayMetrics
from llamaswap.gateway.extproc import DESTINATION, NAMESPACE, RequestInfo, decide
from llamaswap.gateway.nodes import Endpoint, Figures
from llamaswap.gateway.pick import Policy, Reason

ONE = Endpoint("one", "10.0.0.1", 8080)
TWO = Endpoint("two", "10.0.0.2", 8080)


def figures(*, resident: str = "", waiting: int = 0) -> Figures:
    loaded = frozenset(filter(None, resident.split(",")))
    return Figures(waiting, 0, 0.0, loaded, frozenset(), capacity=1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def board() -> Board:
    board = Board(Policy(stale_after=1.0, down_after=2, spread_depth=4), GatewayMetrics(), Clock())
    board.set_endpoints([ONE, TWO])
    return board


def picks(board: Board, reason: Reason) -> float:
    value = board.metrics.registry.get_sample_value(
        "llamaswap_gateway_picks_total", {"reason": reason.value}
    )
    assert value is not None
    return value


def test_picks_since_a_scrape_count_until_the_next_scrape_of_that_node(board: Board) -> None:
    board.scraped(ONE, figures(resident="a"), frozenset({"a"}))
    board.scraped(TWO, figures(resident="a", waiting=2), frozenset({"a"}))
    chosen = [board.choose("a", 100) for _ in range(4)]
    # one: queues 0, 1, 2 (a tie with two's 2 goes to the first listed), then 3: two.
    assert [c.node.name if c else None for c in chosen] == ["one", "one", "one", "two"]
    board.scraped(ONE, figures(resident="a"), frozenset({"a"}))  # it now shows what it got
    assert (pick := board.choose("a", 100)) is not None
    assert pick.node.name == "one"
    assert picks(board, Reason.LOADED) == 5


def test_a_node_down_is_routed_around_and_comes_back_with_a_good_scrape(board: Board) -> None:
    board.scraped(ONE, figures(resident="a"), frozenset({"a"}))
    board.scraped(TWO, figures(), frozenset({"a"}))
    board.failed(ONE, "refused")
    assert (first := board.choose("a", 0)) is not None
    assert first.node.name == "one"  # one failure: still up
    board.failed(ONE, "refused")
    assert (second := board.choose("a", 0)) is not None
    assert (second.node.name, second.reason) == ("two", Reason.ROOM)
    board.failed(TWO, "refused")
    board.failed(TWO, "refused")
    assert board.choose("a", 0) is None
    assert board.metrics.registry.get_sample_value("llamaswap_gateway_unavailable_total") == 1
    board.scraped(ONE, figures(resident="a"), frozenset({"a"}))
    assert (third := board.choose("a", 0)) is not None
    assert third.node.name == "one"
    up = board.metrics.registry.get_sample_value
    assert (up("llamaswap_gateway_node_up", {"endpoint": "one"}), up(
        "llamaswap_gateway_node_up", {"endpoint": "two"})) == (1, 0)  # fmt: skip


def test_a_changed_endpoint_list_keeps_the_figures_of_the_nodes_it_keeps(board: Board) -> None:
    board.scraped(ONE, figures(resident="a"), frozenset({"a"}))
    board.scraped(TWO, figures(resident="a"), frozenset({"a"}))
    moved = Endpoint("two", "10.0.0.3", 8080)
    board.set_endpoints([ONE, moved])
    one, two = board.nodes()
    assert one.figures is not None  # kept
    assert two.endpoint == moved
    assert two.figures is None  # another address: a new node, not yet scraped
    board.scraped(TWO, figures(), frozenset())  # a scrape of the old address, late: dropped
    assert board.nodes()[1].figures is None
    assert board.models() == ["a"]


def test_the_answer_to_envoy_names_the_node_in_metadata_and_the_header(board: Board) -> None:
    board.scraped(ONE, figures(resident="b"), frozenset({"b"}))
    board.scraped(TWO, figures(resident="a"), frozenset({"a"}))
    exchange = RequestInfo(method="POST", path="/v1/chat/completions",
                         content_type="application/json")  # fmt: skip
    body = json.dumps({"model": "a", "messages": []}).encode()
    answer = decide(board, exchange, body, at_headers=False)
    assert answer.WhichOneof("response") == "request_body"
    assert answer.dynamic_metadata[NAMESPACE][DESTINATION] == "10.0.0.2:8080"
    (option,) = answer.request_body.response.header_mutation.set_headers
    assert (option.header.key, option.header.raw_value) == (DESTINATION, b"10.0.0.2:8080")
    assert option.append_action == option.OVERWRITE_IF_EXISTS_OR_ADD


@pytest.mark.parametrize(
    ("method", "path", "query", "body", "node"),
    [
        ("GET", "/upstream/a/ui/index.html", b"", b"", "two"),
        ("GET", "/props", b"model=a", b"", "two"),
        ("POST", "/v1/chat/completions", b"", b"{not json", "one"),  # the node answers 400
        ("GET", "/health", b"", b"", "one"),
    ],
)
def test_the_model_is_read_where_llamaswap_reads_it(
    board: Board, method: str, path: str, query: bytes, body: bytes, node: str
) -> None:
    board.scraped(ONE, figures(), frozenset({"b"}))
    board.scraped(TWO, figures(resident="a", waiting=1), frozenset({"a"}))
    info = RequestInfo(method, path, query, "application/json")
    answer = decide(board, info, body, at_headers=not body)
    phase = "request_body" if body else "request_headers"
    assert answer.WhichOneof("response") == phase
    expected = {"one": "10.0.0.1:8080", "two": "10.0.0.2:8080"}[node]
    assert answer.dynamic_metadata[NAMESPACE][DESTINATION] == expected


def test_no_node_up_is_a_503_and_the_model_list_is_the_union(board: Board) -> None:
    post = RequestInfo("POST", "/v1/completions", b"", "application/json")
    answer = decide(board, post, b'{"model": "a"}', at_headers=False)
    assert answer.immediate_response.status.code == 503
    assert b"no llamaswap node is up to serve model 'a'" in answer.immediate_response.body
    board.scraped(ONE, figures(), frozenset({"b", "c"}))
    board.scraped(TWO, figures(), frozenset({"a", "b"}))
    models = RequestInfo("GET", "/v1/models")
    listing = decide(board, models, b"", at_headers=True).immediate_response
    assert listing.status.code == 200
    assert [m["id"] for m in json.loads(listing.body)["data"]] == ["a", "b", "c"]


def test_with_a_node_key_the_model_list_is_a_nodes_to_answer(board: Board) -> None:
    """The nodes want a key (LLAMASWAP_NODE_API_KEY): the picker cannot check the
    client's, so a node answers GET /v1/models."""
    board.scraped(ONE, figures(), frozenset({"a"}))
    models = RequestInfo("GET", "/v1/models")
    answer = decide(board, models, b"", at_headers=True, list_models=False)
    assert answer.dynamic_metadata[NAMESPACE][DESTINATION] == "10.0.0.1:8080"
