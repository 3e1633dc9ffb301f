"""``proxy/resume.py``: what a preempted generation keeps, and how it goes on, as plain data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamaswap.proxy.resume import Generation, generation

CHAT = "/v1/chat/completions"


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


def chunk(
    content: str | None = None,
    *,
    id: str = "c1",
    role: bool = False,
    finish: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    if role:
        delta = {"role": "assistant", **delta}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": id, "created": 7 if id == "c1" else 9, "choices": [choice], **extra}


def made(path: str, document: dict[str, Any]) -> Generation:
    found = generation(path, document)
    assert found is not None
    return found


def events_of(data: bytes) -> list[Any]:
    lines = [line[5:].strip() for line in data.split(b"\n") if line.startswith(b"data:")]
    return [line.decode() if line == b"[DONE]" else json.loads(line) for line in lines]


@pytest.mark.parametrize(
    ("path", "document"),
    [
        ("/v1/embeddings", {"input": "x"}),
        (CHAT, {"messages": [{"role": "user", "content": "x"}], "n": 2}),
        (CHAT, {"messages": [{"role": "user", "content": "x"}], "logprobs": True}),
        (CHAT, {"messages": [{"role": "assistant", "content": [{"type": "text"}]}]}),
        (CHAT, {"messages": []}),
        (CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}),
        ("/v1/completions", {"prompt": ["a", "b"]}),
        ("/v1/completions", {"prompt": "a", "echo": True}),
        ("/v1/completions", {"prompt": "a", "suffix": "z"}),
        ("/completion", {"prompt": "a", "n_probs": 3}),
        ("/completion", {"prompt": 5}),
    ],
)
def test_what_cannot_be_resumed_exactly_is_not_preemptible(
    path: str, document: dict[str, Any]
) -> None:
    assert generation(path, document) is None


def test_the_first_segment_streams_and_reports_usage_whatever_the_client_asked() -> None:
    g = made(CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": None})
    assert json.loads(g.body()) == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": None,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    native = made("/completion", {"prompt": "hi"})
    assert json.loads(native.body())["return_tokens"] is True


def test_a_chat_goes_on_from_a_prefill_with_the_rest_of_its_tokens() -> None:
    question = {"role": "user", "content": "hi"}
    g = made(CHAT, {"messages": [question], "max_tokens": 10, "stream": True})
    g.body()
    sent = g.feed(sse(chunk("one", role=True), chunk(" two")) + b'data: {"id": "c1", "cho')
    assert [e["choices"][0]["delta"].get("content") for e in events_of(sent)] == ["one", " two"]
    g.checkpoint()  # the unfinished event is dropped
    assert (g.text, g.tokens) == ("one two", 2)
    assert json.loads(g.body()) == {
        "messages": [question, {"role": "assistant", "content": "one two"}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "continue_final_message": True,
        "add_generation_prompt": False,
    }


def test_a_clients_own_prefill_is_continued() -> None:
    prefill = {"role": "assistant", "content": "Sure:"}
    g = made(CHAT, {"messages": [{"role": "user", "content": "hi"}, prefill]})
    g.body()
    g.feed(sse(chunk(" yes", role=True)))
    assert json.loads(g.body())["messages"][-1] == {"role": "assistant", "content": "Sure: yes"}


def test_later_segments_read_as_the_first_one() -> None:
    usage_too = {"include_usage": True}
    document = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    g = made(CHAT, {**document, "stream_options": usage_too})
    g.body()
    g.feed(sse(chunk("one", role=True)))
    g.body()
    usage = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
    later = sse(
        chunk(None, id="c2", role=True),  # the opening: said once already
        chunk(" two", id="c2", role=True),
        chunk(None, id="c2", finish="length"),
        {"id": "c2", "created": 9, "choices": [], "usage": usage, "timings": {"prompt_n": 3}},
        "[DONE]",
    )
    events = events_of(g.feed(later))
    assert events[-1] == "[DONE]"
    assert [e["id"] for e in events[:-1]] == ["c1", "c1", "c1"]
    assert {e["created"] for e in events[:-1]} == {7}
    assert events[0]["choices"][0]["delta"] == {"content": " two"}
    # The prompt counted once (less the one-token prefill), every token once.
    assert events[2]["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert g.recomputed == 3  # llama.cpp's prompt_n: what it read again


def test_usage_the_client_did_not_ask_for_is_not_sent() -> None:
    g = made(CHAT, {"messages": [{"role": "user", "content": "hi"}], "stream": True})
    g.body()
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    sent = g.feed(sse(chunk("one"), {"id": "c1", "choices": [], "usage": usage}, "[DONE]"))
    assert events_of(sent)[-1] == "[DONE]"
    assert len(events_of(sent)) == 2
    assert b"\n\n\n" not in sent  # the dropped event's blank line went with it


def test_a_client_that_did_not_stream_gets_one_answer() -> None:
    g = made(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    g.body()
    assert g.feed(sse(chunk("one", role=True))) == b""
    g.body()
    usage = {"prompt_tokens": 6, "completion_tokens": 1, "total_tokens": 7}
    g.feed(sse(chunk(" two", id="c2"), chunk(None, id="c2", finish="stop", usage=usage)))
    assert g.answer() == {
        "id": "c1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "one two"},
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


def test_a_tool_call_or_reasoning_pins_it() -> None:
    for delta in ({"tool_calls": [{"index": 0}]}, {"reasoning_content": "hmm"}):
        g = made(CHAT, {"messages": [{"role": "user", "content": "hi"}], "stream": True})
        g.body()
        assert not g.pinned
        g.feed(sse({"id": "c1", "choices": [{"index": 0, "delta": delta}]}))
        assert g.pinned


def test_completions_append_the_text_to_the_prompt() -> None:
    g = made("/v1/completions", {"prompt": "Once", "max_tokens": 5})
    g.body()
    g.feed(sse({"id": "t", "choices": [{"index": 0, "text": " upon", "finish_reason": None}]}))
    assert json.loads(g.body()) | {"stream_options": None} == {
        "prompt": "Once upon",
        "max_tokens": 4,
        "stream": True,
        "stream_options": None,
    }


def test_llama_cpp_completion_appends_the_token_ids() -> None:
    g = made("/completion", {"prompt": "Once", "n_predict": 5, "stream": True})
    g.body()
    sent = g.feed(sse({"content": " upon", "tokens": [11, 12], "stop": False}))
    assert events_of(sent) == [{"content": " upon", "stop": False}]  # ids asked by llamaswap
    assert json.loads(g.body())["prompt"] == ["Once", 11, 12]
    assert json.loads(g.body())["n_predict"] == 3
    final = {"content": "", "stop": True, "tokens_predicted": 3, "tokens_evaluated": 6}
    [event] = events_of(g.feed(sse({"content": " a", "tokens": [13]}, final)))[1:]
    # the prompt counted once, every token once
    assert (event["tokens_predicted"], event["tokens_evaluated"]) == (5, 4)


def test_without_ids_the_text_is_appended() -> None:
    g = made("/completion", {"prompt": [1, 2]})
    g.body()
    g.feed(sse({"content": " upon", "stop": False}))
    assert json.loads(g.body())["prompt"] == [1, 2, " upon"]


def test_a_server_that_answers_again_from_the_start_is_seen() -> None:
    g = made(CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    g.body()
    g.feed(sse(chunk("one"), chunk(" two")))
    seen = [g.repeated]
    g.body()
    g.feed(sse(chunk("one", id="c2")))
    seen.append(g.repeated)  # not yet the whole of it
    g.feed(sse(chunk(" two", id="c2"), chunk(" three", id="c2")))
    seen.append(g.repeated)
    g.body()
    g.feed(sse(chunk(" four", id="c3")))
    seen.append(g.repeated)
    assert seen == [False, False, True, False]


def test_a_request_preempted_before_its_first_token_is_not_seen_as_answered_again() -> None:
    g = made(CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    g.body()
    g.feed(b"")  # checkpointed before the server sent a token
    g.body()
    g.feed(sse(chunk("one", id="c2")))
    assert (g.segments, g.repeated) == (2, False)


def arguments(piece: str, finish: str | None = None) -> dict[str, Any]:
    call = {"index": 0, "function": {"arguments": piece}}
    return {"id": "c1", "choices": [{"delta": {"tool_calls": [call]}, "finish_reason": finish}]}


def test_a_whole_answer_keeps_its_reasoning_and_tool_calls() -> None:
    g = made(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    g.body()
    call = {"index": 0, "id": "call-1", "type": "function", "function": {"name": "f"}}
    reasoning = {
        "id": "c1",
        "model": "served",
        "choices": [{"delta": {"reasoning_content": "so"}}],
    }
    start = {"id": "c1", "choices": [{"delta": {"tool_calls": [call]}}]}
    g.feed(sse(reasoning, start, arguments('{"a":'), arguments("1}", "tool_calls")))
    assert g.pinned
    answer = g.answer()
    assert answer["model"] == "served"
    function = {"name": "f", "arguments": '{"a":1}'}
    assert answer["choices"][0] == {
        "index": 0,
        "finish_reason": "tool_calls",
        "message": {
            "role": "assistant",
            "content": None,
            "reasoning_content": "so",
            "tool_calls": [{"id": "call-1", "type": "function", "function": function}],
        },
    }


def test_legacy_functions_are_not_preempted_for_a_whole_answer() -> None:
    document = {"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}
    assert generation(CHAT, document) is None
    assert generation(CHAT, {**document, "stream": True}) is not None
