from __future__ import annotations

import json

from llamaswap.observability import ActivityLog, ActivityRecord, UsageTap


def test_usage_from_a_json_body() -> None:
    tap = UsageTap("application/json")
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    for i in range(0, len(body), 10):
        tap.feed(body[i : i + 10].encode())
    usage = tap.usage()
    assert (usage.prompt_tokens, usage.completion_tokens) == (7, 3)


def test_usage_from_the_last_sse_events_and_anthropic_names() -> None:
    tap = UsageTap("text/event-stream")
    for i in range(5000):
        tap.feed(f'data: {{"choices": [{{"delta": {{"content": "w{i}"}}}}]}}\n\n'.encode())
    tap.feed(b'data: {"choices": [], "usage": {"input_tokens": 11, "output_tokens": 5000}}\n\n')
    tap.feed(b"data: [DONE]\n\n")
    usage = tap.usage()
    assert (usage.prompt_tokens, usage.completion_tokens) == (11, 5000)


def test_usage_from_the_responses_apis_last_event() -> None:
    tap = UsageTap("text/event-stream")
    usage = {"input_tokens": 4, "output_tokens": 2, "total_tokens": 6}
    for kind, response in [
        ("response.created", {"status": "in_progress", "usage": None}),
        ("response.completed", {"status": "completed", "usage": usage}),
    ]:
        event = {"type": kind, "sequence_number": 0, "response": response}
        tap.feed(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())
    found = tap.usage()
    assert (found.prompt_tokens, found.completion_tokens) == (4, 2)


def test_no_usage_and_garbage_give_nothing() -> None:
    for content_type, body in [
        ("application/json", b"{not json"),
        ("application/json", b'{"usage": "lots"}'),
        ("text/event-stream", b"data: {}\n\ndata: [DONE]\n\n"),
        ("text/plain", b'{"usage": {"prompt_tokens": 1}}'),
    ]:
        tap = UsageTap(content_type)
        tap.feed(body)
        usage = tap.usage()
        assert (usage.prompt_tokens, usage.completion_tokens) == (None, None)


def record(id: int, model: str) -> ActivityRecord:
    return ActivityRecord(
        id=id, time="t", model=model, method="POST", path="/v1/x", status=200,
        duration_ms=1.0, queue_wait_ms=0.0, scheduler="fifo", priority=0, band="normal",
        score=None, prompt_tokens=None, completion_tokens=None, error=None, metadata={},
    )  # fmt: skip


def test_activity_log_is_bounded_newest_first_and_filtered() -> None:
    log = ActivityLog(capacity=3)
    for i, model in enumerate(["a", "b", "a", "b", "a"], start=1):
        log.add(record(i, model))
    assert [r.id for r in log.recent()] == [5, 4, 3]
    assert [r.id for r in log.recent(limit=2)] == [5, 4]
    assert [r.id for r in log.recent(model="a")] == [5, 3]
    assert log.recent(model="zzz") == []
    assert record(1, "a").to_json()["metadata"] == {}
