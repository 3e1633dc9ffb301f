"""Anthropic Messages over OpenAI chat completions: ``anthropic = "translate"``.

Many model servers (llama-cpp-python, vLLM, older llama-server builds) speak only OpenAI's
chat completions. For a model configured with ``anthropic = "translate"``, llamaswap turns a
``POST /v1/messages`` request into a ``POST /v1/chat/completions`` one
(:func:`chat_request`), and the answer back into a Messages answer: a whole one with
:func:`message_response`, a stream event by event with :class:`MessageStream`.
``POST /v1/messages/count_tokens`` is answered by llamaswap itself with an estimate
(:func:`estimate_tokens`): chat servers share no tokenizer route.

Pure functions and values, no I/O: ``forward.py`` sends and relays the bytes.

What does not translate is dropped rather than refused where the answer stays right without
it (``thinking`` settings and blocks, ``metadata``, cache hints), and refused with a 400 where
it would not (a server tool such as web search, a document block). A chat ``tool`` message
carries only text: the images in a tool result go in the ``user`` message after it.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any, final

import attrs

from llamaswap.errors import BadRequest

from .sse import SseData, json_chunk

__all__ = [
    "COUNT_TOKENS_PATH",
    "MESSAGES_PATH",
    "MessageStream",
    "Translation",
    "chat_body",
    "chat_request",
    "error_event",
    "estimate_tokens",
    "local_answer",
    "message_response",
]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
CHAT_PATH = "/v1/chat/completions"

#: OpenAI ``finish_reason`` → Anthropic ``stop_reason``.
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

#: Status → Anthropic error type, for errors sent as an ``error`` event mid-stream.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}

#: The estimate's rule of thumb: about four characters of English text make a token.
CHARS_PER_TOKEN = 4


@attrs.frozen
class Translation:
    """What the answer's conversion needs to know about the request."""

    model: str  # the name the client asked for, echoed in the answer
    stop_sequences: tuple[str, ...] = ()

    #: The content type of a translated stream: None, the server's own (an event stream).
    stream_type = None

    def whole(self, answer: object) -> dict[str, Any]:
        """:func:`message_response`."""
        return message_response(answer, self)

    def stream_lines(self) -> MessageStream:
        """The converter of the server's event stream."""
        return MessageStream(self)


# --- the request --------------------------------------------------------------------------


def chat_body(body: dict[str, Any]) -> tuple[bytes, dict[str, Any], Translation]:
    """:func:`chat_request`, and the request as JSON bytes.

    Raises:
        BadRequest: as :func:`chat_request`, or ``body`` nests too deeply to write out again.
    """
    try:
        chat, translation = chat_request(body)
        return json.dumps(chat, separators=(",", ":")).encode(), chat, translation
    except RecursionError as exc:  # read at the edge of the limit, deeper once converted
        raise BadRequest(_TOO_DEEP) from exc


_TOO_DEEP = "the request body nests arrays and objects too deeply to translate"


def chat_request(body: dict[str, Any]) -> tuple[dict[str, Any], Translation]:
    """A Messages request ``body`` as a chat-completions request, and what the answer needs.

    Raises:
        BadRequest: ``body`` is not a Messages request, or asks for something chat
            completions cannot express (a server tool, a document block).
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be a list of messages", param="messages")
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": _text(system, "system")})
    for index, message in enumerate(messages):
        chat.extend(_chat_messages(message, f"messages.{index}"))
    request: dict[str, Any] = {"model": body.get("model"), "messages": chat}
    for name in ("max_tokens", "temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            request[name] = body[name]
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise BadRequest("'stop_sequences' must be a list of strings", param="stop_sequences")
    if stops:
        request["stop"] = stops
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be a list of tools", param="tools")
        request["tools"] = [_tool(tool, f"tools.{i}") for i, tool in enumerate(tools)]
    if body.get("tool_choice") is not None:
        request.update(_tool_choice(body["tool_choice"]))
    if body.get("stream") is True:
        request["stream"] = True
        request["stream_options"] = {"include_usage": True}
    model = body.get("model")
    return request, Translation(model if isinstance(model, str) else "", tuple(stops))


def _text(content: object, where: str) -> str:
    """A string, or the text of a list of text blocks (``system``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, block in enumerate(content):
            if not (isinstance(block, dict) and block.get("type") == "text"):
                raise BadRequest(f"{where}.{index}: expected a text block", param=where)
            texts.append(str(block.get("text", "")))
        return "\n".join(texts)
    raise BadRequest(f"{where}: expected a string or a list of text blocks", param=where)


def _tool_result(content: object, where: str) -> tuple[str, list[dict[str, Any]]]:
    """A tool result's text, and its images as ``image_url`` parts.

    A chat ``tool`` message carries only text, so the images go in a ``user`` message
    after the turn's ``tool`` messages (as Anthropic-to-OpenAI translators do).
    """
    if not isinstance(content, list):
        return _text(content, where), []
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image":
            images.append(_image_part(block, f"{where}.{index}"))
        else:
            raise BadRequest(f"{where}.{index}: expected a text or image block", param=where)
    return "\n".join(texts), images


def _chat_messages(message: object, where: str) -> list[dict[str, Any]]:
    """One Messages message as chat messages: tool results become ``tool`` messages,
    and the images in them go first in the ``user`` message that follows."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise BadRequest(
            f"{where}: expected an object with role 'user' or 'assistant'", param="messages"
        )
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: expected a string or a list of blocks")
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []  # the tool results' images
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content.{index}"
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input", {}), separators=(",", ":"))
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            text, images = _tool_result(block.get("content", ""), f"{at}.content")
            shown.extend(images)
            if block.get("is_error") is True:
                text = f"Error: {text}"
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the model's own earlier reasoning: chat servers take none back
        else:
            raise BadRequest(f"{at}: a {kind!r} block cannot be translated to chat completions")
    # The answers to the previous turn's calls first: every tool message follows the
    # assistant message whose calls it answers, before any other message.
    chat: list[dict[str, Any]] = list(results)
    parts = [*shown, *parts]
    if parts or calls:
        message_out: dict[str, Any] = {"role": role}
        if all(part["type"] == "text" for part in parts):
            # No text is null beside tool calls, as OpenAI writes it; "" otherwise (null
            # content is only for an assistant's tool calls: strict servers refuse it).
            message_out["content"] = "\n".join(part["text"] for part in parts) or (
                None if calls else ""
            )
        else:
            message_out["content"] = parts
        if calls:
            message_out["tool_calls"] = calls
        chat.append(message_out)
    return chat


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``image`` block as an ``image_url`` content part."""
    source = block.get("source")
    url = None
    if isinstance(source, dict):
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        elif source.get("type") == "url" and isinstance(source.get("url"), str):
            url = str(source["url"])
    if url is None:
        raise BadRequest(f"{where}.source: expected a base64 or url image source")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise BadRequest(f"{where}: expected an object with a 'name'", param="tools")
    if tool.get("type", "custom") != "custom":
        raise BadRequest(
            f"{where}: the server tool {tool['type']!r} cannot be translated to chat completions",
            param="tools",
        )
    function: dict[str, Any] = {
        "name": tool["name"],
        "parameters": tool.get("input_schema", {"type": "object"}),
    }
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or kind not in ("auto", "any", "tool", "none"):
        raise BadRequest(
            "'tool_choice' must be an object with type 'auto', 'any', 'tool' or 'none'",
            param="tool_choice",
        )
    out: dict[str, Any] = {}
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def local_answer(path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """llamaswap's own answer to a request for ``path`` under ``anthropic = "translate"``,
    if it answers that path itself: a token count is its estimate, since a
    chat-completions server has no such route; None for a path the model server answers."""
    if path == COUNT_TOKENS_PATH:
        return {"input_tokens": estimate_tokens(body)}
    return None


def estimate_tokens(body: dict[str, Any]) -> int:
    """``count_tokens``'s answer: every string in the request's ``system``, ``messages`` and
    ``tools`` (not images) at :data:`CHARS_PER_TOKEN` characters a token, rounded up. A
    guide, not a tokenizer: the model's own may count a third more or less.

    Raises:
        BadRequest: ``body`` is not a Messages request (as :func:`chat_body`).
    """
    chat_body(body)  # the same checks as a request to answer
    counted = [body.get(name) for name in ("system", "messages", "tools")]
    try:
        return math.ceil(_characters(counted) / CHARS_PER_TOKEN)
    except RecursionError as exc:
        raise BadRequest(_TOO_DEEP) from exc


def _characters(value: object) -> int:
    """The length of every string in ``value``, but an image's or document's ``source``."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_characters(item) for key, item in value.items() if key != "source")
    if isinstance(value, list):
        return sum(_characters(item) for item in value)
    return 0


# --- the answer ---------------------------------------------------------------------------


def _stop(finish_reason: object, matched: object, translation: Translation) -> dict[str, Any]:
    """``stop_reason`` and ``stop_sequence``. Which stop sequence ended the text is known
    only from servers that say so (vLLM's ``stop_reason`` in the choice)."""
    if (
        finish_reason == "stop"
        and isinstance(matched, str)
        and matched in translation.stop_sequences
    ):
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    reason = (
        _STOP_REASONS.get(finish_reason, "end_turn")
        if isinstance(finish_reason, str)
        else "end_turn"
    )
    return {"stop_reason": reason, "stop_sequence": None}


def _usage(usage: object) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    return {
        "input_tokens": _count(usage.get("prompt_tokens")),
        "output_tokens": _count(usage.get("completion_tokens")),
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _object(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one: an answer may omit anything."""
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def _tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex}"


def _message_id(chat_id: object) -> str:
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else f"msg_{uuid.uuid4().hex}"


def _tool_input(arguments: object, name: object) -> dict[str, Any]:
    """A tool call's ``arguments`` (a JSON string) as the object Messages wants."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise ValueError(
            f"the model called tool {name!r} with arguments that are not a JSON object: "
            f"{arguments!r}"
        )
    return value


def message_response(chat: object, translation: Translation) -> dict[str, Any]:
    """A whole chat-completions answer as a Messages answer.

    Raises:
        ValueError: ``chat`` is not a chat completion (no choice), or a tool call's
            arguments are not a JSON object.
    """
    choices = chat.get("choices") if isinstance(chat, dict) else None
    if not isinstance(chat, dict) or not isinstance(choices, list) or not choices:
        raise ValueError("the model's answer is not a chat completion (no 'choices')")
    choice = _object(choices[0])
    message = _object(choice.get("message"))
    content: list[dict[str, Any]] = []
    if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
        content.append(
            {"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}
        )
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for call in _list(message.get("tool_calls")):
        call = _object(call)
        function = _object(call.get("function"))
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or _tool_id(),
                "name": function.get("name"),
                "input": _tool_input(function.get("arguments"), function.get("name")),
            }
        )
    return {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": translation.model,
        "content": content,
        **_stop(choice.get("finish_reason"), choice.get("stop_reason"), translation),
        "usage": _usage(chat.get("usage")),
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return (
        b"event: "
        + kind.encode()
        + b"\ndata: "
        + json.dumps({"type": kind, **data}, separators=(",", ":")).encode()
        + b"\n\n"
    )


def error_event(status: int, message: str) -> bytes:
    """An ``error`` event: how a Messages stream says it broke off."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return _event("error", {"error": {"type": kind, "message": message}})


@final
class MessageStream:
    """A chat-completions event stream, fed as it arrives, re-told as Messages events.

    ``feed`` takes the upstream's bytes in any pieces and returns the events they complete;
    ``close`` returns what ends the message (``message_delta`` with the stop reason and
    usage, ``message_stop``), unless the upstream's stream already carried an error. The
    upstream is asked for usage (``stream_options.include_usage``); it comes in a last
    chunk without choices, after the ``finish_reason``.
    """

    def __init__(self, translation: Translation) -> None:
        self._translation = translation
        self._events = SseData()
        self._started = False
        self._done = False  # an error event ended the stream, or close() did
        self._blocks = 0  # content blocks opened so far
        self._open: tuple[str, object] | None = None  # ("text"/"thinking"/"tool", call index)
        self._call_id = ""  # the open tool_use block's id
        self._finish: object = None
        self._matched: object = None
        self._usage: object = None

    def feed(self, data: bytes) -> bytes:
        return b"".join(self._chunk(event) for event in self._events.feed(data))

    def close(self) -> bytes:
        """The end of the message, once the upstream's stream has ended."""
        # An event the upstream left unterminated:
        out = bytearray(b"".join(self._chunk(event) for event in self._events.close()))
        if self._done:
            return bytes(out)
        self._done = True
        out += self._start(None) + self._close_block()
        delta = _stop(self._finish, self._matched, self._translation)
        out += _event("message_delta", {"delta": delta, "usage": _usage(self._usage)})
        out += _event("message_stop", {})
        return bytes(out)

    def _chunk(self, data: bytes) -> bytes:
        if self._done or (chunk := json_chunk(data)) is None:
            return b""
        if "error" in chunk:  # llama-server reports a failure mid-stream so
            self._done = True
            error = _object(chunk["error"])
            code = error.get("code")
            status = code if isinstance(code, int) else 500
            return error_event(status, str(error.get("message", chunk["error"])))
        out = bytearray(self._start(chunk.get("id")))
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        for choice in _list(chunk.get("choices")):
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            out += self._delta(_object(choice.get("delta")))
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
                out += self._close_block()
        return bytes(out)

    def _start(self, chat_id: object) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": _message_id(chat_id),
            "type": "message",
            "role": "assistant",
            "model": self._translation.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _event("message_start", {"message": message})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        out = bytearray()
        for kind, name in (("thinking", "reasoning_content"), ("text", "content")):
            piece = delta.get(name)
            if isinstance(piece, str) and piece:
                if self._open is None or self._open[0] != kind:
                    block: dict[str, Any] = {"type": kind, kind: ""}
                    if kind == "thinking":
                        block["signature"] = ""  # chat servers sign nothing
                    out += self._open_block(kind, block)
                out += self._block_delta({"type": f"{kind}_delta", kind: piece})
        for call in _list(delta.get("tool_calls")):
            call = _object(call)
            function = _object(call.get("function"))
            # A call's first delta has its id (some servers repeat it in every one); a new
            # index or a new id starts the next call.
            index, call_id = call.get("index", 0), call.get("id")
            opened = self._open is not None and self._open == ("tool", index)
            if not opened or (call_id and call_id != self._call_id):
                self._call_id = call_id or _tool_id()
                block = {
                    "type": "tool_use",
                    "id": self._call_id,
                    "name": function.get("name", ""),
                    "input": {},
                }
                out += self._open_block("tool", block, index)
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                out += self._block_delta({"type": "input_json_delta", "partial_json": arguments})
        return bytes(out)

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self._blocks - 1, "delta": delta})

    def _open_block(self, kind: str, block: dict[str, Any], call: object = None) -> bytes:
        out = self._close_block()
        self._open = (kind, call)
        self._blocks += 1
        return out + _event(
            "content_block_start", {"index": self._blocks - 1, "content_block": block}
        )

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"index": self._blocks - 1})
