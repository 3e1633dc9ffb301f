"""Ollama's API over OpenAI's (``proxy/ollama.py``): requests, whole answers and streams,
as pure code on fixed clocks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamaswap.errors import BadRequest
from llamaswap.proxy.ollama import PATHS, SAMPLING, Translation, translate

NOW = "2026-12-05T12:00:00Z"


def ticking(*moments: int) -> Any:
    """A monotonic clock in nanoseconds that reads ``moments`` in turn."""
    readings = iter(moments)
    return lambda: next(readings)


def openai(path: str, body: dict[str, Any]) -> tuple[dict[str, Any], Translation]:
    raw, request, translation = translate(path, body, model=body.get("model", "m"))
    assert json.loads(raw) == request
    return request, translation


def on_clocks(translation: Translation, *moments: int) -> Translation:
    """``translation`` with its clocks fixed: started at ``moments[0]``, then the rest."""
    return Translation(
        translation.path,
        translation.model,
        translation.stream,
        translation.raw,
        translation.loads_only,
        clock=ticking(*moments),
        wall=lambda: NOW,
    )


# --- requests ------------------------------------------------------------------------------


def test_a_chat_streams_unless_it_says_not_and_then_asks_for_usage() -> None:
    messages = [{"role": "user", "content": "hi"}]
    request, translation = openai("/api/chat", {"model": "m", "messages": messages})
    assert request == {
        "model": "m",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert (translation.stream, translation.upstream_path) == (True, "/v1/chat/completions")
    request, translation = openai(
        "/api/chat", {"model": "m", "messages": messages, "stream": False}
    )
    assert "stream_options" not in request
    assert request["stream"] is False
    assert not translation.stream


def test_sampling_options_keep_their_names_num_predict_is_max_tokens_and_load_options_go() -> None:
    options = {name: 1 for name in SAMPLING} | {"num_predict": 64, "num_ctx": 8192, "num_gpu": 99}
    request, _ = openai("/api/chat", {"model": "m", "messages": [], "options": options})
    assert {key: request[key] for key in [*SAMPLING, "max_tokens"]} == {
        name: 1 for name in SAMPLING
    } | {"max_tokens": 64}
    assert "num_ctx" not in request
    assert "num_gpu" not in request
    for unlimited in (-1, -2):  # no limit, fill the context: the server's own limit
        request, _ = openai("/api/chat", {"model": "m", "options": {"num_predict": unlimited}})
        assert "max_tokens" not in request


def test_format_is_a_json_object_or_a_schema() -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
    assert openai("/api/chat", {"model": "m", "format": "json"})[0]["response_format"] == {
        "type": "json_object"
    }
    assert openai("/api/chat", {"model": "m", "format": schema})[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "format", "schema": schema},
    }
    assert "response_format" not in openai("/api/chat", {"model": "m", "format": ""})[0]
    with pytest.raises(BadRequest) as info:
        openai("/api/chat", {"model": "m", "format": "yaml"})
    assert info.value.param == "format"


def test_images_become_parts_with_their_type_and_tool_calls_are_matched_by_name() -> None:
    png, jpeg, unknown = "iVBORw0KGgoAAA", "/9j/4AAQ", "AAAA"
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is this?", "images": [png, jpeg]},
        {"role": "user", "content": "", "images": [unknown]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "weather", "arguments": {"city": "Oslo"}}},
                {"function": {"name": "time", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_name": "time", "content": "noon"},
        {"role": "tool", "content": "rain"},  # no name: the first call still open
        {"role": "tool", "tool_name": "news", "content": "none"},  # no call open for it
    ]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    request, _ = openai("/api/chat", {"model": "m", "messages": messages, "tools": tools})
    assert request["tools"] == tools
    assert request["messages"] == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{jpeg}"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{unknown}"}}
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_3_0",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "call_3_1",
                    "type": "function",
                    "function": {"name": "time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "content": "noon", "tool_call_id": "call_3_1"},
        {"role": "tool", "content": "rain", "tool_call_id": "call_3_0"},
        {"role": "tool", "content": "none", "tool_call_id": "call_news"},
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": ""}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "", "images": [1]}]}, "messages[0].images"),
        ({"options": [1]}, "options"),
        ({"tools": {"a": 1}}, "tools"),
    ],
)
def test_a_chat_of_the_wrong_shape_is_a_400_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as info:
        openai("/api/chat", {"model": "m", **body})
    assert info.value.param == param


def test_generate_applies_the_chat_template_unless_raw() -> None:
    body = {"model": "m", "prompt": "hi", "system": "be brief", "stream": False}
    request, translation = openai("/api/generate", body)
    assert request["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert translation.upstream_path == "/v1/chat/completions"
    request, translation = openai("/api/generate", {**body, "raw": True})
    assert request == {"model": "m", "prompt": "hi", "stream": False}
    assert translation.upstream_path == "/v1/completions"
    assert translation.raw
    with pytest.raises(BadRequest, match="leave out 'raw'"):
        openai("/api/generate", {**body, "raw": True, "images": ["iVBORw0KGgo"]})


@pytest.mark.parametrize("field", ["template", "suffix", "context"])
def test_generate_refuses_what_has_no_openai_counterpart(field: str) -> None:
    with pytest.raises(BadRequest) as info:
        openai("/api/generate", {"model": "m", "prompt": "hi", field: "x"})
    assert info.value.param == field
    openai("/api/generate", {"model": "m", "prompt": "hi", field: ""})  # empty: not asked


def test_nothing_to_generate_only_loads_the_model() -> None:
    assert openai("/api/chat", {"model": "m"})[1].loads_only
    assert openai("/api/chat", {"model": "m", "messages": []})[1].loads_only
    assert openai("/api/generate", {"model": "m", "prompt": ""})[1].loads_only
    assert openai("/api/generate", {"model": "m", "prompt": "", "raw": True})[1].loads_only
    assert not openai("/api/generate", {"model": "m", "images": ["AAAA"]})[1].loads_only
    chat = on_clocks(openai("/api/chat", {"model": "m"})[1], 0)
    assert chat.loaded() == {
        "model": "m",
        "created_at": NOW,
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "load",
    }
    generate = on_clocks(openai("/api/generate", {"model": "m"})[1], 0)
    assert generate.loaded() == {
        "model": "m",
        "created_at": NOW,
        "response": "",
        "done": True,
        "done_reason": "load",
    }


def test_embed_takes_a_text_or_texts_and_the_older_route_a_prompt() -> None:
    request, translation = openai("/api/embed", {"model": "e", "input": ["a", "b"]})
    assert request == {"model": "e", "input": ["a", "b"]}
    assert (translation.upstream_path, translation.stream) == ("/v1/embeddings", False)
    assert openai("/api/embed", {"model": "e", "input": "a", "dimensions": 4})[0] == {
        "model": "e",
        "input": "a",
        "dimensions": 4,
    }
    assert openai("/api/embeddings", {"model": "e", "prompt": "a"})[0] == {
        "model": "e",
        "input": "a",
    }
    with pytest.raises(BadRequest) as info:
        openai("/api/embed", {"model": "e", "input": [1, 2]})
    assert info.value.param == "input"


def test_the_model_is_the_one_named_or_the_default() -> None:
    _raw, request, _ = translate("/api/chat", {"messages": []}, model="fallback")
    assert request["model"] == "fallback"
    assert {"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"} == PATHS


# --- whole answers -------------------------------------------------------------------------

USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
TIMINGS = {"prompt_ms": 1.5, "predicted_ms": 30.25}
ENDED = {
    "done": True,
    "prompt_eval_count": 12,
    "prompt_eval_duration": 1_500_000,
    "eval_count": 3,
    "eval_duration": 30_250_000,
}


def test_a_whole_chat_answer_with_thinking_and_tool_calls() -> None:
    translation = on_clocks(openai("/api/chat", {"model": "m", "stream": False})[1], 1000, 5000)
    message = {
        "role": "assistant",
        "content": "let me look",
        "reasoning_content": "the user wants weather",
        "tool_calls": [
            {
                "id": "x",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    answer = {
        "choices": [{"message": message, "finish_reason": "tool_calls"}],
        "usage": USAGE,
        "timings": TIMINGS,
    }
    assert translation.whole(answer) == {
        "model": "m",
        "created_at": NOW,
        "message": {
            "role": "assistant",
            "content": "let me look",
            "thinking": "the user wants weather",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
        },
        "done_reason": "stop",
        "total_duration": 4000,
        **ENDED,
    }


def test_a_whole_generate_answer_says_length_and_a_raw_one_reads_the_text() -> None:
    body = {"model": "m", "prompt": "hi", "stream": False}
    chat = on_clocks(openai("/api/generate", body)[1], 0, 7)
    answer = {"choices": [{"message": {"content": "ok"}, "finish_reason": "length"}]}
    assert chat.whole(answer) == {
        "model": "m",
        "created_at": NOW,
        "response": "ok",
        "done": True,
        "done_reason": "length",
        "total_duration": 7,
    }
    raw = on_clocks(openai("/api/generate", {**body, "raw": True})[1], 0, 7)
    completion = {"choices": [{"text": "ok", "finish_reason": "stop"}], "usage": USAGE}
    assert raw.whole(completion) == {
        "model": "m",
        "created_at": NOW,
        "response": "ok",
        "done": True,
        "done_reason": "stop",
        "total_duration": 7,
        "prompt_eval_count": 12,
        "eval_count": 3,
    }


def test_embeddings_come_back_in_the_inputs_order() -> None:
    answer = {
        "data": [{"index": 1, "embedding": [0.2]}, {"index": 0, "embedding": [0.1]}],
        "usage": {"prompt_tokens": 4},
    }
    embed = on_clocks(openai("/api/embed", {"model": "e", "input": ["a", "b"]})[1], 10, 30)
    assert embed.whole(answer) == {
        "model": "e",
        "embeddings": [[0.1], [0.2]],
        "total_duration": 20,
        "prompt_eval_count": 4,
    }
    older = on_clocks(openai("/api/embeddings", {"model": "e", "prompt": "a"})[1], 0)
    assert older.whole(answer) == {"embedding": [0.1]}


@pytest.mark.parametrize(
    ("path", "answer", "says"),
    [
        ("/api/chat", {"object": "error"}, "no 'choices'"),
        ("/api/chat", [], "no 'choices'"),
        (
            "/api/chat",
            {"choices": [{"message": {"tool_calls": [{"function": {"arguments": "[1]"}}]}}]},
            "not a JSON object",
        ),
        ("/api/embed", {"data": {}}, "no 'data'"),
        ("/api/embed", {"data": [{"embedding": "AAAA"}]}, "not a list of numbers"),
    ],
)
def test_an_answer_that_does_not_translate_is_a_value_error(
    path: str, answer: object, says: str
) -> None:
    translation = openai(path, {"model": "m", "stream": False, "input": "a"})[1]
    with pytest.raises(ValueError, match=says):
        translation.whole(answer)


# --- streams -------------------------------------------------------------------------------


def sse(*chunks: object) -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)


def delta(**fields: object) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def finished(reason: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def lines(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"\n") or not data
    return [json.loads(line) for line in data.splitlines()]


def streamed(translation: Translation, data: bytes, split: int | None = None) -> bytes:
    stream = translation.stream_lines()
    pieces = [data] if split is None else [data[:split], data[split:]]
    return b"".join(stream.feed(piece) for piece in pieces) + stream.close()


CHAT_STREAM = (
    sse(
        delta(role="assistant"),
        delta(reasoning_content="hmm"),
        delta(content="Hel"),
        delta(content="lo"),
        delta(tool_calls=[{"index": 0, "id": "c", "function": {"name": "wea", "arguments": ""}}]),
        delta(tool_calls=[{"index": 0, "function": {"name": "ther", "arguments": '{"city":'}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": ' "Oslo"}'}}]),
        finished("tool_calls"),
        {"choices": [], "usage": USAGE, "timings": TIMINGS},
    )
    + b"data: [DONE]\n\n"
)


def test_a_chat_stream_is_a_line_a_piece_then_the_tool_calls_then_the_end() -> None:
    translation = on_clocks(openai("/api/chat", {"model": "m"})[1], 0, 99)
    head = {"model": "m", "created_at": NOW}
    assert lines(streamed(translation, CHAT_STREAM)) == [
        head | {"message": {"role": "assistant", "content": "", "thinking": "hmm"}, "done": False},
        head | {"message": {"role": "assistant", "content": "Hel"}, "done": False},
        head | {"message": {"role": "assistant", "content": "lo"}, "done": False},
        head
        | {
            "message": {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
            },
            "done": False,
        },
        head
        | {
            "message": {"role": "assistant", "content": ""},
            "done_reason": "stop",
            "total_duration": 99,
            **ENDED,
        },
    ]


def test_a_stream_reads_the_same_however_its_bytes_are_split() -> None:
    whole = streamed(on_clocks(openai("/api/chat", {"model": "m"})[1], 0, 99), CHAT_STREAM)
    for split in range(len(CHAT_STREAM) + 1):
        translation = on_clocks(openai("/api/chat", {"model": "m"})[1], 0, 99)
        assert streamed(translation, CHAT_STREAM, split) == whole, split


def test_a_generate_stream_and_a_raw_one() -> None:
    translation = on_clocks(openai("/api/generate", {"model": "m", "prompt": "hi"})[1], 0, 5)
    data = sse(delta(content="ok"), finished("length"))  # no [DONE], no usage
    assert lines(streamed(translation, data)) == [
        {"model": "m", "created_at": NOW, "response": "ok", "done": False},
        {
            "model": "m",
            "created_at": NOW,
            "response": "",
            "done": True,
            "done_reason": "length",
            "total_duration": 5,
        },
    ]
    body = {"model": "m", "prompt": "hi", "raw": True}
    raw = on_clocks(openai("/api/generate", body)[1], 0, 5)
    text = sse({"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]})
    assert [line["response"] for line in lines(streamed(raw, text))] == ["ok", ""]


def test_an_error_in_the_stream_ends_it_with_ollamas_error_line() -> None:
    translation = on_clocks(openai("/api/chat", {"model": "m"})[1], 0)
    data = sse(delta(content="a"), {"error": {"code": 500, "message": "out of memory"}})
    data += sse(delta(content="never"))
    assert lines(streamed(translation, data))[1:] == [{"error": "out of memory"}]


def test_a_stream_skips_what_it_cannot_read_and_other_choices() -> None:
    translation = on_clocks(openai("/api/chat", {"model": "m"})[1], 0, 1)
    data = b"data: not json\n\n: a comment\n\n" + sse(
        [1], {"choices": [{"index": 1, "delta": {"content": "other"}}]}, delta(content="ok")
    )
    assert [line["message"]["content"] for line in lines(streamed(translation, data))] == [
        "ok",
        "",
    ]
