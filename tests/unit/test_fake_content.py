"""The fake server's request reading and answer shapes that need no process:
``encoding_format``, the Responses API's input, and which tool a request makes it call
(tests/e2e/test_fake_server.py runs them with the SDKs)."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from llamaswap.fake_server._content import (
    BadRequest,
    called_tool,
    embedding,
    encoded,
    form_fields,
    response_input,
)


def test_base64_is_the_vectors_little_endian_float32_bytes() -> None:
    vector = embedding("hello", 8)
    text = encoded(vector, "base64")
    assert isinstance(text, str)
    floats = struct.unpack("<8f", base64.b64decode(text))
    assert floats == pytest.approx(vector, abs=1e-7)  # float32's precision
    assert encoded(vector, "float") == encoded(vector, None) == vector


def test_another_encoding_format_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="encoding_format must be 'float' or 'base64'"):
        encoded([0.5], "binary")


@pytest.mark.parametrize(
    ("body", "texts", "question"),
    [
        ({"input": "hi there"}, ["", "hi there"], "hi there"),
        (
            {
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "an answer"},
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "second"}],
                    },
                ],
            },
            ["Be brief.", "first", "an answer", "second"],
            "second",
        ),
    ],
)
def test_a_responses_input_is_its_texts_and_the_last_user_message(
    body: dict[str, Any], texts: list[str], question: str
) -> None:
    assert response_input(body) == (texts, question)


def test_a_responses_input_that_is_no_string_or_list_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="'input' must be a string or a list"):
        response_input({"input": 3})


TOOLS = [{"name": "get_weather", "input_schema": {}}, {"name": "get_time", "input_schema": {}}]
FUNCTIONS = [{"type": "function", "function": {"name": name}} for name in ("f", "g")]


@pytest.mark.parametrize(
    ("kind", "body", "tool"),
    [
        ("messages", {"tools": TOOLS, "tool_choice": {"type": "any"}}, "get_weather"),
        (
            "messages",
            {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_time"}},
            "get_time",
        ),
        ("messages", {"tools": TOOLS, "tool_choice": {"type": "auto"}}, None),
        ("messages", {"tools": TOOLS, "tool_choice": {"type": "none"}}, None),
        ("messages", {"tools": TOOLS}, None),
        ("messages", {"tool_choice": {"type": "any"}}, None),
        ("chat", {"tools": FUNCTIONS, "tool_choice": "required"}, "f"),
        ("chat", {"tools": FUNCTIONS, "tool_choice": FUNCTIONS[1]}, "g"),
        ("chat", {"tools": FUNCTIONS, "tool_choice": "auto"}, None),
    ],
)
def test_the_tool_a_request_makes_it_call(
    kind: str, body: dict[str, Any], tool: str | None
) -> None:
    assert called_tool(kind, body) == tool


def test_the_fake_reads_multipart_and_urlencoded_forms() -> None:
    multipart = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        b'RIFF\r\n--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nw\r\n--b--\r\n'
    )
    assert form_fields(multipart, 'multipart/form-data; boundary="b"') == {
        "file": b"RIFF",
        "model": b"w",
    }
    assert form_fields(b"model=a+b&model=c&x=", "application/x-www-form-urlencoded") == {
        "model": b"a b",
        "x": b"",
    }
    with pytest.raises(BadRequest, match="expected a form"):
        form_fields(b"{}", "application/json")
    with pytest.raises(BadRequest, match="no boundary"):
        form_fields(multipart, "multipart/form-data")
