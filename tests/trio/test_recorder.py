"""The Recorder on Trio's mock clock: time to first token, and a capture filed under its
record's ID before the record is told to anyone."""

from __future__ import annotations

import json

import trio
import trio.testing

from llamaswap.config.model import Config
from llamaswap.observability import ActivityLog, ActivityRecord, Captures, CaptureTap, Metrics
from llamaswap.proxy.exchange import Exchange, Recorder
from llamaswap.router import Router
from tests.fakes import FakeProbe, FakeSpawner


def recording(nursery: trio.Nursery) -> Recorder:
    spawner = FakeSpawner(nursery)
    router = Router(Config(), spawner=spawner, probe=FakeProbe(spawner))
    return Recorder(ActivityLog(), Metrics(router), Captures(lambda: 1 << 20))


async def test_time_to_first_token_runs_from_arrival_to_the_first_answer_byte(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    recorder = recording(nursery)
    exchange = Exchange("POST", "/v1/chat/completions", model="chat")
    await trio.sleep(0.25)
    exchange.answer(b"")  # an empty piece is no answer yet
    await trio.sleep(0.5)
    exchange.answer(b'data: {"choices": []}\n\n')
    await trio.sleep(1.0)
    exchange.answer(b'data: {"choices": []}\n\n')
    exchange.status = 200
    record = recorder.finish(exchange)
    assert (record.ttft_ms, record.duration_ms) == (750.0, 1750.0)
    unanswered = recorder.finish(Exchange("POST", "/v1/chat/completions"))
    assert unanswered.ttft_ms is None


async def test_a_capture_is_filed_under_its_record_before_the_record_is_told(
    nursery: trio.Nursery,
) -> None:
    recorder = recording(nursery)
    found: list[bool] = []

    def told(record: ActivityRecord) -> None:
        found.append(recorder.captures.get(record.id) is not None)

    recorder.activity.add_listener(told)
    exchange = Exchange("POST", "/v1/embeddings", model="embed")
    exchange.capture = CaptureTap("POST", "/v1/embeddings", b"", [], limit=64)
    exchange.capture.request_body(b'{"input": "hi"}')
    record = recorder.finish(exchange)
    plain = recorder.finish(Exchange("POST", "/v1/embeddings", model="embed"))
    assert (record.captured, plain.captured) == (True, False)
    assert found == [True, False]
    capture = recorder.captures.get(record.id)
    assert capture is not None
    assert json.loads(capture.request_body.kept) == {"input": "hi"}
    assert capture.to_json()["response"] is None  # the client left before any answer
