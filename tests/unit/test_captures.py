"""Captures: what a request sent and was answered, cut at a size, without credentials, kept
while they fit in a budget."""

from __future__ import annotations

import base64

from llamaswap.observability import Captures, CaptureTap
from llamaswap.observability.captures import Capture, CapturedBody, CapturesStatistics


def tap(limit: int = 1024) -> CaptureTap:
    headers = [
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer sk-secret"),
        (b"X-Api-Key", b"sk-secret"),
        (b"proxy-authorization", b"Basic c2VjcmV0"),
        (b"cookie", b"session=secret"),
        (b"user-agent", b"test"),
    ]
    return CaptureTap("POST", "/v1/chat/completions", b"a=1", headers, limit)


def test_a_capture_keeps_heads_and_bodies_but_no_credentials() -> None:
    taken = tap()
    taken.request_body(b'{"model": ')
    taken.request_body(b'"chat"}')
    answer = [(b"content-type", b"text/event-stream"), (b"set-cookie", b"session=secret")]
    taken.response_start(200, answer)
    for chunk in (b"data: 1\n\n", b"", b"data: [DONE]\n\n"):
        taken.response_body(chunk)
    capture = taken.finish(7)
    assert capture.to_json() == {
        "id": 7,
        "request": {
            "method": "POST",
            "path": "/v1/chat/completions",
            "query": "a=1",
            "headers": [["content-type", "application/json"], ["user-agent", "test"]],
            "body": {"size": 17, "kept": 17, "text": '{"model": "chat"}'},
        },
        "response": {
            "status": 200,
            "headers": [["content-type", "text/event-stream"]],
            "body": {"size": 23, "kept": 23, "text": "data: 1\n\ndata: [DONE]\n\n"},
        },
    }
    assert "secret" not in repr(capture)


def test_bodies_are_cut_at_the_limit_and_counted_whole() -> None:
    taken = tap(limit=10)
    for _ in range(1000):
        taken.request_body(b"0123456789abcdef")
    body = taken.finish(1).request_body
    assert body == CapturedBody(b"0123456789", 16_000)
    assert body.to_json() == {"size": 16_000, "kept": 10, "text": "0123456789"}


def test_a_character_cut_in_two_at_the_limit_is_left_out() -> None:
    # "é" is two bytes in UTF-8: the limit falls between them.
    assert CapturedBody("abé".encode()[:3], 4).to_json() == {"size": 4, "kept": 3, "text": "ab"}
    # Not cut: an incomplete character at the end is not text.
    whole = CapturedBody("abé".encode()[:3], 3).to_json()
    assert whole == {"size": 3, "kept": 3, "base64": base64.b64encode(b"ab\xc3").decode()}


def test_a_body_that_is_not_utf8_is_base64() -> None:
    gzip = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"
    assert CapturedBody(gzip, 8).to_json() == {"size": 8, "kept": 8, "base64": "H4sIAAAAAAA="}


def test_no_answer_sent_no_response() -> None:
    taken = tap()
    taken.request_body(b"{}")
    document = taken.finish(3).to_json()
    assert document["response"] is None
    assert document["request"]["body"] == {"size": 2, "kept": 2, "text": "{}"}


def capture(id: int, size: int) -> Capture:
    """A capture of ``size`` bytes (its request body)."""
    body = CapturedBody(b"x" * size, size)
    return Capture(id, "GET", "", "", (), body, None, None, CapturedBody(b"", 0))


def test_the_newest_captures_are_kept_while_they_fit_in_the_budget() -> None:
    budget = 100
    captures = Captures(lambda: budget)
    for id in range(1, 5):
        captures.add(capture(id, 30))
    assert captures.statistics() == CapturesStatistics(captures=3, bytes=90)
    assert captures.get(1) is None
    assert [captures.get(id) for id in (2, 3, 4)] == [capture(id, 30) for id in (2, 3, 4)]
    # A smaller budget (a reload) applies at the next capture.
    budget = 40
    captures.add(capture(5, 10))
    assert captures.statistics() == CapturesStatistics(captures=2, bytes=40)
    assert [captures.get(4), captures.get(5)] == [capture(4, 30), capture(5, 10)]
    # One that does not fit alone is not kept, and pushes out the rest.
    captures.add(capture(6, 41))
    assert captures.statistics() == CapturesStatistics(captures=0, bytes=0)


def test_the_size_of_a_capture_counts_its_texts_and_what_its_bodies_kept() -> None:
    taken = CaptureTap("POST", "/p", b"q=1", [(b"ab", b"cd")], limit=4)
    taken.request_body(b"123456")
    taken.response_start(200, [(b"ef", b"gh")])
    taken.response_body(b"xy")
    # path 2 + query 3 + fields 4 + 4 + bodies 4 + 2
    assert taken.finish(1).size == 19
