"""Token speeds, cached and draft tokens: llama.cpp's ``timings`` read by the UsageTap, and
written by the fake server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given

from llamaswap.fake_server._content import Completion
from llamaswap.observability import UsageTap
from llamaswap.observability.usage import Usage, _report
from tests.strategies import json_values

TIMINGS = {"prompt_n": 9, "prompt_ms": 12.0, "prompt_per_second": 750.0,
           "predicted_n": 4, "predicted_ms": 100.0, "predicted_per_second": 40.0}  # fmt: skip


def tapped(content_type: str, *chunks: bytes) -> Usage:
    tap = UsageTap(content_type)
    for chunk in chunks:
        tap.feed(chunk)
    return tap.usage()


def event(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def test_speeds_and_counts_from_a_json_answer() -> None:
    body = json.dumps({"usage": {"prompt_tokens": 9, "completion_tokens": 4}, "timings": TIMINGS})
    # Split mid-document: the tap parses once, at the end.
    usage = tapped("application/json", body[:20].encode(), body[20:].encode())
    assert usage == Usage(9, 4, 750.0, 40.0)


def test_speeds_and_counts_from_separate_final_events() -> None:
    # llama-server: timings on the last chunk; usage (include_usage) on its own chunk.
    usage = tapped(
        "text/event-stream",
        event({"choices": [{"delta": {"content": "hi"}}], "usage": None}),
        event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}),
        event({"choices": [{"finish_reason": "stop"}], "usage": None, "timings": TIMINGS}),
        b"data: [DONE]\n\n",
    )
    assert usage == Usage(9, 4, 750.0, 40.0)


def test_the_last_timings_of_a_stream_count() -> None:
    # With timings_per_token, every chunk has timings: the final figures are the last ones.
    early = {**TIMINGS, "predicted_per_second": 1.0}
    usage = tapped("text/event-stream", event({"timings": early}), event({"timings": TIMINGS}))
    assert usage == Usage(None, None, 750.0, 40.0)


@pytest.mark.parametrize(
    "bad",
    ["fast", True, -1.0, None, 10**400, [40.0]],
)
def test_speeds_that_are_not_finite_non_negative_numbers_are_none(bad: object) -> None:
    timings = {"prompt_per_second": bad, "predicted_per_second": 12}
    usage = tapped("application/json", json.dumps({"timings": timings}).encode())
    assert usage == Usage(None, None, None, 12.0)


@pytest.mark.parametrize("bad", [-5, 2**53, 10**30, True, 1.5, "3"])
def test_counts_that_are_not_plausible_token_counts_are_none(bad: object) -> None:
    # A negative count would make the metrics raise, a huge one overflow the store.
    usage = {"prompt_tokens": bad, "completion_tokens": 4}
    assert tapped("application/json", json.dumps({"usage": usage}).encode()) == Usage(None, 4)


def test_cached_and_draft_tokens_from_the_timings() -> None:
    # llama-server with a draft model (speculative decoding), part of the prompt cached.
    timings = {**TIMINGS, "cache_n": 230, "draft_n": 40, "draft_n_accepted": 31}
    usage = tapped("text/event-stream", event({"timings": timings}), b"data: [DONE]\n\n")
    assert usage == Usage(None, None, 750.0, 40.0, 230, 40, 31)
    # Not plausible token counts: not counted.
    implausible = {"cache_n": -1, "draft_n": 1.5, "draft_n_accepted": "31"}
    assert tapped("application/json", json.dumps({"timings": implausible}).encode()) == Usage()


def test_no_timings_no_speeds() -> None:
    assert tapped("application/json", b'{"usage": {"prompt_tokens": 2}}') == Usage(2, None)
    assert tapped("application/json", b'{"timings": "soon"}') == Usage()
    assert tapped("text/plain", json.dumps({"timings": TIMINGS}).encode()) == Usage()


@given(json_values("usage", "timings"))
def test_usage_and_timings_are_what_json_loads_finds(document: object) -> None:
    body = json.dumps(document).encode()  # NaN and Infinity included, as servers may send
    expected = json.loads(body)
    if not isinstance(expected, dict):
        expected = {}
    report = _report(body)
    assert repr(report.usage) == repr(expected.get("usage"))
    assert repr(report.timings) == repr(expected.get("timings"))


@pytest.mark.parametrize(
    "body",
    [
        b'{"usage": {"prompt_tokens": 2, "completion_tokens": 1}, "x": NaN}',  # not msgspec's JSON
        '{"usage": {"prompt_tokens": 2, "completion_tokens": 1}}'.encode("utf-16"),
        b'{"usage": {"prompt_tokens": 9}, "usage": {"prompt_tokens": 2, "completion_tokens": 1}}',
    ],
    ids=["NaN", "UTF-16", "the last of two"],
)
def test_counts_are_read_as_json_loads_reads_them(body: bytes) -> None:
    assert tapped("application/json", body) == Usage(2, 1)


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b"[1, 2]", b"{", b""])
def test_an_answer_that_is_not_a_json_object_reports_nothing(body: bytes) -> None:
    # Too deep for either parser: nothing, rather than an error that loses the record.
    assert tapped("application/json", body) == Usage()
    assert tapped("text/event-stream", b'data: {"usage": ' + body + b"}\n\n") == Usage()


def completion(*, stream: bool, include_usage: bool) -> Completion:
    return Completion(
        kind="chat", id="chatcmpl-fake-1", model="m", created=0, prompt_tokens=3, seed="s",
        tokens=4, finish_reason="stop", stream=stream, include_usage=include_usage,
    )  # fmt: skip


def events(tail: bytes) -> list[Any]:
    lines = [line for line in tail.decode().split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_the_fake_server_reports_timings_like_llama_server() -> None:
    job = completion(stream=False, include_usage=False)
    assert job.timings(0.002, 0.1) == {
        "cache_n": 0, "prompt_n": 3, "prompt_ms": 2.0, "prompt_per_token_ms": 0.667,
        "prompt_per_second": 1500.0, "predicted_n": 4, "predicted_ms": 100.0,
        "predicted_per_token_ms": 25.0, "predicted_per_second": 40.0,
    }  # fmt: skip
    # A phase that took no measurable time divides by a microsecond, not by zero.
    assert job.timings(0.0, 0.0)["prompt_per_second"] == 3_000_000.0
    # Prompt tokens in the slot's cache are not processed again (fake_server/_slots.py).
    job.cached = 2
    timings = job.timings(0.002, 0.1)
    assert (timings["cache_n"], timings["prompt_n"], timings["prompt_per_second"]) == (2, 1, 500.0)


def test_the_fake_servers_timings_ride_on_the_last_chunk() -> None:
    timings = completion(stream=True, include_usage=False).timings(0.001, 0.1)
    (finish,) = events(completion(stream=True, include_usage=False).tail(timings))
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["timings"] == timings
    finish, usage = events(completion(stream=True, include_usage=True).tail(timings))
    assert "timings" not in finish
    assert (usage["choices"], usage["usage"]["completion_tokens"]) == ([], 4)
    assert usage["timings"] == timings
    # What the proxy's tap makes of it.
    tail = completion(stream=True, include_usage=True).tail(timings)
    assert tapped("text/event-stream", tail) == Usage(3, 4, 3000.0, 40.0, cached_tokens=0)
