"""Anthropic Messages ↔ OpenAI chat completions (``anthropic = "translate"``): pure converters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message

from llamaswap.config import loads_config
from llamaswap.errors import BadRequest, ConfigError
from llamaswap.proxy.anthropic import (
    MessageStream,
    Translation,
    chat_body,
    chat_request,
    error_event,
    estimate_tokens,
    message_response,
)
from tests.unit.ports import every_port_free

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "the weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_a_request_becomes_a_chat_completion() -> None:
    body = {
        "model": "claude-ish",
        "max_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "metadata": {"user_id": "u1"},  # nothing to say it with: dropped
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAA="},
                    },
                ],
            },
        ],
    }
    chat, translation = chat_request(body)
    assert chat == {
        "model": "claude-ish",
        "max_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
        "messages": [
            {"role": "system", "content": "Be brief.\nBe kind."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA="}},
                ],
            },
        ],
    }
    assert translation == Translation("claude-ish", ("END",))


def test_tool_use_and_results_become_tool_calls_and_tool_messages() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "stream": True,
        "system": "Use tools.",
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "weather in Oslo and Rome?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "two calls", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                    {
                        "type": "tool_use",
                        "id": "t2",
                        "name": "get_weather",
                        "input": {"city": "Rome"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "rain"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "no data"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
    }
    chat, translation = chat_request(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "weather in Oslo and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        # The answers to the calls come first, in order, then what else the user said.
        {"role": "tool", "tool_call_id": "t1", "content": "rain"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: no data"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_TOOL["input_schema"],
                "description": "the weather in a city",
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}  # usage for message_delta
    assert translation == Translation("m")


PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA="}}
PNG_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA="}}


def calls_turn(*ids: str) -> dict[str, Any]:
    calls = [{"type": "tool_use", "id": i, "name": "shot", "input": {}} for i in ids]
    return {"role": "assistant", "content": calls}


def test_empty_text_is_an_empty_string_and_null_only_beside_tool_calls() -> None:
    call = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": ""}]},
            {"role": "assistant", "content": [{"type": "text", "text": ""}, call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
            {"role": "assistant", "content": [{"type": "text", "text": ""}]},
        ],
    }
    chat, _ = chat_request(body)
    assert [message.get("content", "-") for message in chat["messages"]] == ["", None, "", ""]


def test_images_in_tool_results_go_in_a_user_message_after_the_tool_messages() -> None:
    # A chat tool message carries only text: its images follow all of the turn's tool
    # messages (no other message may come between a call and its answer), in one user
    # message with the user's own blocks after them.
    url_image = {"type": "image", "source": {"type": "url", "url": "https://x/a.jpg"}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "take screenshots"},
            calls_turn("t1", "t2", "t3"),
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "the page"}, PNG],
                    },
                    {"type": "tool_result", "tool_use_id": "t2", "content": [url_image]},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t3",
                        "content": [{"type": "text", "text": "no window"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "which is darker?"},
                ],
            },
        ],
    }
    chat, _ = chat_request(body)
    assert chat["messages"][2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "the page"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
        {"role": "tool", "tool_call_id": "t3", "content": "Error: no window"},
        {
            "role": "user",
            "content": [
                PNG_PART,
                {"type": "image_url", "image_url": {"url": "https://x/a.jpg"}},
                {"type": "text", "text": "which is darker?"},
            ],
        },
    ]


def test_an_image_in_the_only_tool_result_makes_a_user_message_of_its_own() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [PNG]}
    body = {"model": "m", "messages": [calls_turn("t1"), {"role": "user", "content": [result]}]}
    assert chat_request(body)[0]["messages"][1:] == [
        {"role": "tool", "tool_call_id": "t1", "content": ""},
        {"role": "user", "content": [PNG_PART]},
    ]
    # Text alone stays in the tool message, as before: no user message is added.
    result["content"] = [{"type": "text", "text": "done"}]
    assert chat_request(body)[0]["messages"][1:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "done"}
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none")],
)
def test_tool_choice(choice: dict[str, str], expected: str) -> None:
    body = {"model": "m", "messages": [], "tools": [WEATHER_TOOL], "tool_choice": choice}
    assert chat_request(body)[0]["tool_choice"] == expected


def tool_results(*blocks: object) -> dict[str, Any]:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": list(blocks)}
    return {"role": "user", "content": [result]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m"}, "'messages' must be a list"),
        ({"model": "m", "messages": [{"role": "system", "content": "x"}]}, "messages.0: expected"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages.0.content.0: a 'document' block cannot be translated",
        ),
        (
            {
                "model": "m",
                "messages": [],
                "tools": [{"type": "web_search_20250305", "name": "w"}],
            },
            "tools.0: the server tool 'web_search_20250305' cannot be translated",
        ),
        (
            {"model": "m", "messages": [tool_results({"type": "document"})]},
            r"messages.0.content.0.content.0: expected a text or image block",
        ),
        (
            {"model": "m", "messages": [tool_results({"type": "image", "source": {}})]},
            r"messages.0.content.0.content.0.source: expected a base64 or url image source",
        ),
        (
            {"model": "m", "system": [PNG], "messages": []},
            r"system.0: expected a text block",  # images go in messages, not the system
        ),
        ({"model": "m", "messages": [], "stop_sequences": "END"}, "'stop_sequences' must be"),
        ({"model": "m", "messages": [], "tool_choice": {"type": "some"}}, "'tool_choice' must"),
    ],
)
def test_what_cannot_be_translated_is_a_bad_request(body: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        chat_request(body)


def chat_answer(message: dict[str, Any], finish: str, **choice: object) -> dict[str, Any]:
    return {
        "id": "chatcmpl-7",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }


def test_an_answer_with_text_and_a_tool_call() -> None:
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    answer = message_response(chat_answer(message, "tool_calls"), Translation("claude-ish"))
    assert answer == {
        "id": "msg_chatcmpl-7",
        "type": "message",
        "role": "assistant",
        "model": "claude-ish",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 5},
    }
    Message.model_validate(answer)  # what the SDK reads it as


@pytest.mark.parametrize(
    ("finish", "matched", "stop_reason", "stop_sequence"),
    [
        ("stop", None, "end_turn", None),
        ("length", None, "max_tokens", None),
        ("tool_calls", None, "tool_use", None),
        ("content_filter", None, "refusal", None),
        ("stop", "END", "stop_sequence", "END"),  # vLLM names the stop string
        ("stop", "other", "end_turn", None),  # not one the request gave
        (None, None, "end_turn", None),
    ],
)
def test_stop_reasons(
    finish: str | None, matched: str | None, stop_reason: str, stop_sequence: str | None
) -> None:
    message = {"role": "assistant", "content": "x"}
    chat = chat_answer(message, finish, stop_reason=matched)  # type: ignore[arg-type]
    answer = message_response(chat, Translation("m", ("END",)))
    assert (answer["stop_reason"], answer["stop_sequence"]) == (stop_reason, stop_sequence)


def test_an_answer_that_cannot_be_translated() -> None:
    with pytest.raises(ValueError, match="no 'choices'"):
        message_response({"error": "x"}, Translation("m"))
    call = {"id": "c", "function": {"name": "f", "arguments": "[1, 2"}}
    bad = chat_answer({"role": "assistant", "tool_calls": [call]}, "tool_calls")
    with pytest.raises(ValueError, match="tool 'f' with arguments that are not a JSON object"):
        message_response(bad, Translation("m"))


# --- streams ------------------------------------------------------------------------------


def sse(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: " + (c if isinstance(c, str) else json.dumps(c)).encode() + b"\n\n" for c in chunks
    )


def delta(finish: str | None = None, **fields: object) -> dict[str, Any]:
    choice = {"index": 0, "delta": fields, "finish_reason": finish}
    return {"id": "chatcmpl-9", "object": "chat.completion.chunk", "choices": [choice]}


USAGE = {"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event, checking that the name matches the data's type."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        name, document = name_line.removeprefix("event: "), json.loads(data_line[6:])
        assert document["type"] == name
        out.append((name, document))
    return out


def translate(upstream: bytes, translation: Translation, *, piece: int = 0) -> bytes:
    """Feed ``upstream`` in one piece, or ``piece`` bytes at a time, then close."""
    stream = MessageStream(translation)
    size = piece or len(upstream) or 1
    out = b"".join(stream.feed(upstream[i : i + size]) for i in range(0, len(upstream), size))
    return out + stream.close()


def final_message(data: bytes) -> Message:
    """What the Anthropic SDK makes of the events."""
    snapshot = None
    bufs: dict[int, bytes] = {}
    for _, event in events(data):
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    return snapshot


TEXT_STREAM = sse(
    delta(role="assistant", content=""),
    delta(content="Hel"),
    delta(content="lo"),
    delta("length"),
    USAGE,
    "[DONE]",
)


def test_a_text_stream_is_told_as_message_events() -> None:
    out = translate(TEXT_STREAM, Translation("claude-ish"))
    assert [(name, data.get("index")) for name, data in events(out)] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("message_delta", None),
        ("message_stop", None),
    ]
    start = events(out)[0][1]["message"]
    assert (start["id"], start["model"], start["content"]) == ("msg_chatcmpl-9", "claude-ish", [])
    assert events(out)[5][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    message = final_message(out)
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello"  # type: ignore[union-attr]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 2)


@pytest.mark.parametrize("piece", [1, 7, 64])
def test_the_stream_may_arrive_in_any_pieces(piece: int) -> None:
    whole = translate(TEXT_STREAM, Translation("m"))
    cut = translate(TEXT_STREAM.replace(b"\n", b"\r\n"), Translation("m"), piece=piece)
    # The same events; only the generated message ID could differ, and it does not.
    assert cut == whole


def test_a_tool_call_stream_becomes_tool_use_blocks() -> None:
    call = {"index": 0, "id": "call_1", "type": "function"}
    upstream = sse(
        delta(role="assistant", reasoning_content="Need the weather."),
        delta(content="Checking."),
        delta(tool_calls=[{**call, "function": {"name": "get_weather", "arguments": ""}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}]),
        delta(
            tool_calls=[
                {"index": 1, "id": "call_2", "function": {"name": "now", "arguments": "{}"}}
            ]
        ),
        delta("tool_calls"),
        USAGE,
        "[DONE]",
    )
    out = translate(upstream, Translation("m"))
    kinds = [
        (
            name,
            data.get("index"),
            (data.get("content_block") or data.get("delta") or {}).get("type"),
        )
        for name, data in events(out)
    ]
    assert kinds == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    message = final_message(out)
    assert message.stop_reason == "tool_use"
    thinking, text, oslo, now = message.content
    assert thinking.thinking == "Need the weather."  # type: ignore[union-attr]
    assert text.text == "Checking."  # type: ignore[union-attr]
    assert (oslo.id, oslo.name, oslo.input) == ("call_1", "get_weather", {"city": "Oslo"})  # type: ignore[union-attr]
    assert (now.id, now.name, now.input) == ("call_2", "now", {})  # type: ignore[union-attr]


def test_an_error_in_the_stream_ends_it_with_an_error_event() -> None:
    upstream = sse(
        delta(content="Hi"),
        {"error": {"code": 500, "message": "out of memory", "type": "server_error"}},
    )
    out = translate(upstream, Translation("m"))
    assert [name for name, _ in events(out)][-2:] == ["content_block_delta", "error"]
    assert events(out)[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "out of memory"},
    }
    assert events(error_event(429, "busy"))[0][1]["error"]["type"] == "rate_limit_error"


#: A JSON value of each kind, to put where a model server's answer has something else.
_KINDS: list[object] = [None, True, 5, -1.5, "x", [], {}, [5], {"x": 5}]


def mutations(value: object) -> Iterator[object]:
    """``value`` with one of its parts (itself included) replaced by each of ``_KINDS``."""
    yield from _KINDS
    if isinstance(value, dict):
        for key, item in value.items():
            for mutated in mutations(item):
                yield {**value, key: mutated}
    elif isinstance(value, list):
        for index, item in enumerate(value):
            for mutated in mutations(item):
                yield [*value[:index], mutated, *value[index + 1 :]]


CALL = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"a": 1}'}}
FULL: dict[str, Any] = {
    "role": "assistant",
    "reasoning_content": "r",
    "content": "t",
    "tool_calls": [CALL],
}


def test_an_answer_of_any_shape_is_translated_or_refused_with_a_value_error() -> None:
    # A model server may answer anything: the proxy turns a ValueError into a 502.
    for chat in mutations(chat_answer(FULL, "tool_calls", stop_reason="END")):
        try:
            answer = message_response(chat, Translation("m", ("END",)))
        except ValueError:
            continue
        assert answer["type"] == "message"
        json.dumps(answer)


def test_a_stream_of_any_shape_is_told_as_a_whole_message_or_ends_with_an_error() -> None:
    chunks = [
        delta(**FULL),
        delta(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]),
        delta("tool_calls", stop_reason="END"),
        USAGE,
        {"error": {"code": 500, "message": "out of memory"}},
    ]
    for at, chunk in enumerate(chunks):
        for mutated in mutations(chunk):
            upstream = sse(*(json.dumps(c) for c in [*chunks[:at], mutated, *chunks[at + 1 :]]))
            names = [name for name, _ in events(translate(upstream, Translation("m", ("END",))))]
            assert names[-1] == "error" or (names[0], names[-1]) == (
                "message_start",
                "message_stop",
            )


def test_answers_too_deep_for_json_are_refused_or_skipped() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    call = {"function": {"name": "f", "arguments": deep}}
    with pytest.raises(ValueError, match="arguments that are not a JSON object"):
        message_response(chat_answer({"tool_calls": [call]}, "tool_calls"), Translation("m"))
    out = translate(sse(delta(content="Hi"), deep), Translation("m"))
    assert final_message(out).content[0].text == "Hi"  # type: ignore[union-attr]


def test_an_empty_stream_still_makes_a_whole_message() -> None:
    out = translate(b"", Translation("m"))
    assert [name for name, _ in events(out)] == ["message_start", "message_delta", "message_stop"]
    message = final_message(out)
    assert (message.content, message.stop_reason) == ([], "end_turn")


def test_count_tokens_estimate() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}
    body = {
        "model": "m",
        "system": "x" * 10,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 13}, image]}],
    }
    # 10 + 13 characters of text, "user", "text" and "image" (not the image's source): 36
    # characters at 4 a token.
    assert estimate_tokens(body) == 9
    with pytest.raises(BadRequest):
        estimate_tokens({"model": "m"})


def test_a_body_too_deep_to_translate_is_a_bad_request() -> None:
    deep: object = {}
    # Deeper than any Python writes JSON: 3.12 on counts C levels apart from Python's
    # recursion limit, and 3.13 writes a thousand levels.
    for _ in range(100_000):
        deep = {"a": deep}
    use = {"type": "tool_use", "id": "t", "name": "f", "input": deep}
    body = {"model": "m", "messages": [{"role": "assistant", "content": [use]}]}
    with pytest.raises(BadRequest, match="too deeply to translate"):
        chat_body(body)
    with pytest.raises(BadRequest, match="too deeply to translate"):
        estimate_tokens(body)


def test_the_anthropic_key() -> None:
    config = loads_config(
        '[models.a]\ncmd = "serve a ${PORT}"\n'
        '[models.b]\ncmd = "serve b ${PORT}"\nanthropic = "translate"\n',
        free=every_port_free,
    )
    assert (config.models["a"].anthropic, config.models["b"].anthropic) == ("native", "translate")
    with pytest.raises(ConfigError) as error:
        loads_config(
            '[models.a]\ncmd = "serve a ${PORT}"\nanthropic = "translated"\n', free=every_port_free
        )
    [problem] = error.value.problems
    assert problem.path == "models.a.anthropic"
    assert "expected one of 'native', 'translate'" in problem.message
    assert "did you mean 'translate'" in problem.message
