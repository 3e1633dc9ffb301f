"""What the fake server says: deterministic words, embeddings, OpenAI-shaped (chat and
text completions, the Responses API), Anthropic- and llama.cpp-shaped bodies.

Pure functions and values, no I/O: the ASGI app in ``_app`` turns a request body into a
:class:`Completion` and sends the bytes these helpers build.

Continuation. An answer is an endless deterministic sequence of tokens (the first a bare
word, each later one a space and a word) of which ``max_tokens`` decides only how many are
sent, so a shorter answer is a prefix of a longer one. A request that carries the first *k*
tokens of its own answer (a chat's final assistant message, llama-server's prefill, or a
completion prompt with the text appended) gets tokens *k*+1 onward, which is what a
proxy resuming a preempted generation relies on: prefix + continuation is the uninterrupted
answer, token for token. :func:`chat_continuation` and :func:`completion_continuation`
decide where an answer starts; both cost time linear in the text they inspect.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import zlib
from collections.abc import Iterator
from typing import Any, Final, final
from urllib.parse import parse_qsl

import attrs
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

_WORDS: Final = (
    "amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor",
    "indigo", "juniper", "kestrel", "lagoon", "meadow", "nectar", "orchid", "pebble",
    "quartz", "river", "saffron", "tundra", "umber", "velvet", "willow", "yarrow",
    "zephyr", "anchor", "bramble", "canyon", "dune", "estuary", "falcon", "glacier",
    "heron", "island", "jasper", "kelp", "lantern", "marble", "nimbus", "ochre",
    "prairie", "quill", "reef", "summit", "thistle", "upland", "valley", "walnut",
    "alder", "beacon", "cobalt", "drift", "echo", "fern", "grove", "hollow",
    "ivory", "jetty", "knoll", "linen", "moss", "north", "opal", "pine",
)  # fmt: skip

_JSON_SEPARATORS: Final = (",", ":")
DONE: Final = b"data: [DONE]\n\n"


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=_JSON_SEPARATORS).encode()


class BadRequest(Exception):
    pass


def form_fields(body: bytes, content_type: str) -> dict[str, bytes]:
    """A multipart or URL-encoded form's fields (files too), the first value of each.
    Raises BadRequest for any other body, or a malformed one."""
    media_type, _, params = content_type.partition(";")
    media_type = media_type.strip().lower()
    fields: dict[str, bytes] = {}
    if media_type == "application/x-www-form-urlencoded":
        for key, value in parse_qsl(body.decode("latin-1"), keep_blank_values=True):
            fields.setdefault(key, value.encode())
        return fields
    if media_type != "multipart/form-data":
        raise BadRequest(f"expected a form, got Content-Type {content_type!r}")
    boundary = next(
        (
            value.strip().strip('"')
            for key, _, value in (part.strip().partition("=") for part in params.split(";"))
            if key.lower() == "boundary"
        ),
        "",
    )
    if not boundary:
        raise BadRequest("the multipart form has no boundary")
    decoder = MultipartDecoder(boundary.encode("latin-1"))
    decoder.receive_data(body)
    decoder.receive_data(None)
    name: str | None = None
    try:
        while not isinstance(event := decoder.next_event(), (Epilogue, NeedData)):
            if isinstance(event, (Field, File)):
                name = event.name if event.name not in fields else None
                if name is not None:
                    fields[name] = b""
            elif isinstance(event, Data) and name is not None:
                fields[name] += event.data
    except ValueError as exc:
        raise BadRequest(f"the multipart form is malformed: {exc}") from None
    return fields


def error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


# --- deterministic content ------------------------------------------------------------------


_VOCABULARY: Final = frozenset(_WORDS)
_WORD_LENGTHS: Final = sorted({len(word) for word in _WORDS})


def seed(model: str, text: str) -> str:
    """What an answer is derived from: the model's name and the text it answers."""
    return f"{model}\0{text}"


def _generate(state: int, count: int, start: int) -> Iterator[str]:
    """Tokens ``start`` to ``start + count - 1`` of the answer whose generator starts at
    ``state`` (a CRC-32): token 0 a bare word, every later one a space and a word. Token *i*
    never depends on ``count``."""
    for index in range(start + count):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        if index >= start:
            word = _WORDS[(state >> 8) % len(_WORDS)]
            yield word if index == 0 else " " + word


def answer(seed_text: str, count: int, start: int = 0) -> Iterator[str]:
    """Tokens ``start`` to ``start + count - 1`` of the answer to ``seed_text``, lazily."""
    return _generate(zlib.crc32(seed_text.encode()), count, start)


def _prefix_tokens(state: int, text: str, position: int = 0) -> int | None:
    """How many tokens of the answer starting at ``state`` ``text[position:]`` is, exactly;
    None if it is not a whole number of them. Every token has a character at least, so
    this reads at most ``len(text) - position`` of them."""
    tokens = 0
    for token in _generate(state, len(text) - position, 0):
        if position == len(text):
            break
        if not text.startswith(token, position):
            return None
        position += len(token)
        tokens += 1
    return tokens if position == len(text) else None


def chat_continuation(model: str, question: str, prefill: str) -> tuple[str, int]:
    """The seed and first token of a chat answer to ``question`` whose final assistant
    message (a prefill) is ``prefill``.

    A prefill that is exactly the first *k* tokens of the answer (``""`` is *k* = 0)
    continues that answer from token *k*. Any other prefill continues deterministically
    from itself: the words of the answer seeded with the question *and* the prefill, from
    that answer's second token on, so each starts with a space.
    """
    base = seed(model, question)
    tokens = _prefix_tokens(zlib.crc32(base.encode()), prefill)
    if tokens is not None:
        return base, tokens
    return f"{base}\0{prefill}", 1


def _continuation_splits(prompt: str) -> list[tuple[int, int]]:
    """``(split, k)`` for every ``split`` where ``prompt[split:]`` has the shape of *k*
    tokens, a vocabulary word then *k* - 1 times a space and a word; longest first."""
    splits = []
    end, spaced = len(prompt), 0  # where the bare first token ends; the spaced ones after it
    while True:
        for length in _WORD_LENGTHS:
            if length <= end and prompt[end - length : end] in _VOCABULARY:
                splits.append((end - length, spaced + 1))
        space = prompt.rfind(" ", 0, end)
        if space < 0 or prompt[space + 1 : end] not in _VOCABULARY:
            break
        end, spaced = space, spaced + 1
    splits.sort()
    return splits


def completion_continuation(model: str, prompt: str) -> tuple[str, int]:
    """The seed and first token of the answer to a completion ``prompt``.

    The rule: the longest suffix of ``prompt`` that is exactly the first *k* >= 1 tokens of
    the answer to the rest of the prompt is taken for an answer already given, and the
    answer to the rest continues from token *k*; where no suffix is, the answer to the
    whole prompt starts at token 0 (as before continuation existed).

    Only suffixes shaped like tokens (a vocabulary word, then spaced ones) are tried, and
    the prompt's CRC is extended from one candidate to the next, so the cost is linear in
    the prompt: a wrong candidate almost always fails at its first word.
    """
    state, done = zlib.crc32(seed(model, "").encode()), 0
    for split, tokens in _continuation_splits(prompt):
        state, done = zlib.crc32(prompt[done:split].encode(), state), split
        if _prefix_tokens(state, prompt, split) == tokens:
            return seed(model, prompt[:split]), tokens
    return seed(model, prompt), 0


def embedding(text: str, size: int) -> list[float]:
    """A unit vector of ``size`` floats that depends only on ``text``."""
    base = zlib.crc32(text.encode())
    raw = [
        zlib.crc32(index.to_bytes(4, "little"), base) / 0xFFFFFFFF * 2.0 - 1.0
        for index in range(size)
    ]
    norm = math.sqrt(sum(value * value for value in raw)) or 1.0
    return [round(value / norm, 6) for value in raw]


def encoded(vector: list[float], encoding_format: object) -> list[float] | str:
    """An embedding as a request's ``encoding_format`` asks for it: the floats (``"float"``,
    or none), or, as OpenAI sends ``"base64"``, their little-endian float32 bytes in
    base64."""
    if encoding_format in (None, "float"):
        return vector
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    raise BadRequest(f"encoding_format must be 'float' or 'base64', got {encoding_format!r}")


def text_of(content: object) -> str:
    """The text of a message ``content``: a string, or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def prompt_texts(prompt: object) -> list[str]:
    """``prompt``/``input`` as texts: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        if all(isinstance(item, int) for item in prompt):
            return [" ".join(str(item) for item in prompt)] if prompt else []
        texts = []
        for item in prompt:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, list):
                texts.append(" ".join(str(token) for token in item))
            else:
                raise BadRequest(f"unsupported prompt item {item!r}")
        return texts
    raise BadRequest(f"expected a string or a list for the prompt, got {prompt!r}")


def response_input(body: dict[str, Any]) -> tuple[list[str], str]:
    """A Responses API request's texts (``instructions``, then each input message's) and
    the one it answers: ``input`` when it is a string, else its last user message."""
    items = body.get("input")
    if isinstance(items, str):
        return [text_of(body.get("instructions")), items], items
    if not isinstance(items, list):
        raise BadRequest(f"'input' must be a string or a list, got {items!r}")
    messages = [item for item in items if isinstance(item, dict)]
    users = [text_of(item.get("content")) for item in messages if item.get("role") == "user"]
    texts = [text_of(item.get("content")) for item in messages]
    return [text_of(body.get("instructions")), *texts], users[-1] if users else ""


def called_tool(kind: str, body: dict[str, Any]) -> str | None:
    """The tool a request makes the model call, or None for an answer in text. With
    ``tools``: in a chat completion, ``tool_choice`` ``"required"`` calls the first and a
    named function that one; in Messages, ``{"type": "any"}`` calls the first and
    ``{"type": "tool", "name": ...}`` that one. ``"auto"`` and none answer in text."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(tools, list) or not tools:
        return None
    if kind == "messages":
        if not isinstance(choice, dict) or choice.get("type") not in ("any", "tool"):
            return None
        named = tools[0] if choice["type"] == "any" else choice
        name = named.get("name") if isinstance(named, dict) else None
    else:
        if choice == "required":
            choice = tools[0]
        function = choice.get("function") if isinstance(choice, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def token_limit(
    body: dict[str, Any],
    default: int,
    keys: tuple[str, ...] = ("max_completion_tokens", "max_tokens"),
) -> tuple[int, bool]:
    """The response length and whether the request set it (then ``finish_reason`` is length)."""
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"{key} must be a non-negative integer, got {value!r}")
        return value, True
    return default, False


def n_predict(body: dict[str, Any], default: int) -> tuple[int, bool]:
    """llama.cpp's ``/completion`` length: ``n_predict``, where a negative one (``-1``, its
    default) or none means "until the end", which for the fake is ``default`` tokens."""
    value = body.get("n_predict")
    if value is None:
        return default, False
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"n_predict must be an integer, got {value!r}")
    return (value, True) if value >= 0 else (default, False)


@final
@attrs.define(eq=False)
class Completion:
    """One generation request: what to say and how to wrap each piece of it."""

    #: "chat", "text", "responses" (OpenAI's Responses API), "messages" (Anthropic) or
    #: "native" (llama.cpp's /completion)
    kind: str
    id: str
    model: str
    created: int
    prompt_tokens: int
    seed: str  # what the words are derived from
    tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    #: Chat and Messages: the tool the answer calls, its arguments ``{"text": <the words>}``.
    tool: str | None = None
    #: The answer's tokens the request already holds (a prefill, a prompt's tail): the
    #: words start at this token of the answer to ``seed``.
    start: int = 0
    #: The slot that serves it, and how many prompt tokens its cache covered (``_slots``).
    slot: int = 0
    cached: int = 0

    def pieces(self) -> Iterator[str]:
        """The tokens, generated lazily: a huge max_tokens must not stall the event loop."""
        return answer(self.seed, self.tokens, self.start)

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def response(self) -> dict[str, Any]:
        text = "".join(self.pieces())
        if self.kind == "native":
            return self._native(text, self.tokens, stop=True)
        if self.kind == "messages":
            block = self._text_block(text) if self.tool is None else self._tool_use({"text": text})
            return {
                **self._message([block], self.finish_reason),
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": self.tokens},
            }
        if self.kind == "responses":
            return self._response(self.finish_reason, [self._output(text, "completed")])
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish_reason}
        if self.kind == "chat" and self.tool is not None:
            call = self._call(dumps({"text": text}).decode())
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        return {**self._envelope([choice], chunk=False), "usage": self.usage(self.tokens)}

    def timings(self, prompt_seconds: float, predicted_seconds: float) -> dict[str, Any]:
        """llama-server's ``timings`` for ``prompt_seconds`` spent before the first token
        and ``predicted_seconds`` generating all of them: ``cache_n`` prompt tokens were in
        the slot's cache, ``prompt_n`` the others, processed."""
        return {
            "cache_n": self.cached,
            **_phase("prompt", self.prompt_tokens - self.cached, prompt_seconds),
            **_phase("predicted", self.tokens, predicted_seconds),
        }

    def _message(self, content: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
        """A Messages answer, without its usage."""
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
        }

    def _native(self, content: str, predicted: int, stop: bool) -> dict[str, Any]:
        """A llama.cpp ``/completion`` answer (``stop``) or stream event, without timings."""
        document: dict[str, Any] = {
            "index": 0,
            "content": content,
            "id_slot": self.slot,
            "stop": stop,
            "model": self.model,
            "tokens_predicted": predicted,
            "tokens_evaluated": self.prompt_tokens,
        }
        if stop:  # n_predict ran out ("limit"), or the fake's own length, its "end of text"
            stop_type = "limit" if self.finish_reason == "length" else "eos"
            document.update(stop_type=stop_type, stopping_word="", truncated=False)
        return document

    def _call(self, arguments: str) -> dict[str, Any]:
        """The tool call, or (streaming) its first piece."""
        function = {"name": self.tool, "arguments": arguments}
        return {"id": f"call-{self.id}", "type": "function", "function": function}

    @staticmethod
    def _text_block(text: str) -> dict[str, Any]:
        return {"type": "text", "text": text}

    def _tool_use(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """A Messages ``tool_use`` block (streaming: with no ``input`` yet)."""
        return {
            "type": "tool_use",
            "id": f"toolu-{self.id}",
            "name": self.tool,
            "input": arguments,
        }

    def _response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        """A Responses API ``response`` object, ``status`` ``in_progress`` (no usage yet),
        ``completed``, or ``incomplete`` (the request's ``max_output_tokens`` ran out)."""
        usage = None
        if status != "in_progress":
            usage = {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached, "cache_write_tokens": 0},
                "output_tokens": self.tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + self.tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }

    def _output(self, text: str | None, status: str) -> dict[str, Any]:
        """The Responses answer's one output item, a message (``text=None``: no content
        part yet)."""
        content = [] if text is None else [self._output_text(text)]
        return {"type": "message", "id": f"msg-{self.id}", "status": status,
                "role": "assistant", "content": content}  # fmt: skip

    @staticmethod
    def _output_text(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": []}

    def _response_event(self, kind: str, sequence: int, **data: Any) -> bytes:
        """A Responses stream event: named, numbered, and (for the text's events) about
        the one message's one content part."""
        if kind.startswith(("response.output_text.", "response.content_part.")):
            data = {"item_id": f"msg-{self.id}", "output_index": 0, "content_index": 0, **data}
        elif kind.startswith("response.output_item."):
            data = {"output_index": 0, **data}
        return _event(kind, {"sequence_number": sequence, **data})

    def head(self) -> bytes:
        """The events before the first token: Messages' ``message_start`` and its block's
        ``content_block_start`` (for a ``tool_use`` block, then its input's opening); the
        Responses API's ``response.created``, ``response.in_progress`` and the message's
        and its text's ``...added``; a chat tool call's start (its id, name and the
        arguments' opening); nothing for other OpenAI shapes."""
        if self.kind == "messages":
            usage = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
            message = {**self._message([], None), "usage": usage}
            block = self._text_block("") if self.tool is None else self._tool_use({})
            head = _event("message_start", {"message": message}) + _event(
                "content_block_start", {"index": 0, "content_block": block}
            )
            return head if self.tool is None else head + self._input_json('{"text":"')
        if self.kind == "responses":
            started = self._response("in_progress", [])
            return (
                self._response_event("response.created", 0, response=started)
                + self._response_event("response.in_progress", 1, response=started)
                + self._response_event(
                    "response.output_item.added", 2, item=self._output(None, "in_progress")
                )
                + self._response_event(
                    "response.content_part.added", 3, part=self._output_text("")
                )
            )
        if self.tool is not None:
            delta = {"role": "assistant", "tool_calls": [{"index": 0, **self._call('{"text":"')}]}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            return b"data: " + dumps(self._envelope([choice], chunk=True)) + b"\n\n"
        return b""

    @staticmethod
    def _input_json(partial: str) -> bytes:
        """A piece of a Messages ``tool_use`` block's input."""
        delta = {"type": "input_json_delta", "partial_json": partial}
        return _event("content_block_delta", {"index": 0, "delta": delta})

    def tail(self, timings: dict[str, Any]) -> bytes:
        """The events after the last token: the ``finish_reason`` chunk, the usage chunk
        when asked for, then ``[DONE]``; ``timings`` ride on the last chunk, as in
        llama-server. Messages: ``content_block_stop``, ``message_delta`` (stop reason,
        usage and the timings), ``message_stop``. llama.cpp's ``/completion``: one event
        with empty ``content``, ``"stop": true``, the counts and the timings, and no
        ``[DONE]``."""
        if self.kind == "native":
            final = {**self._native("", self.tokens, stop=True), "timings": timings}
            return b"data: " + dumps(final) + b"\n\n"
        if self.kind == "messages":
            delta = {"stop_reason": self.finish_reason, "stop_sequence": None}
            usage = {"input_tokens": self.prompt_tokens, "output_tokens": self.tokens}
            return (
                (b"" if self.tool is None else self._input_json('"}'))
                + _event("content_block_stop", {"index": 0})
                + _event("message_delta", {"delta": delta, "usage": usage, "timings": timings})
                + _event("message_stop", {})
            )
        if self.kind == "responses":
            text = "".join(self.pieces())
            done = self._response(self.finish_reason, [self._output(text, "completed")])
            sequence = 4 + self.tokens  # after the head's 4 events and a delta per token
            return (
                self._response_event("response.output_text.done", sequence, text=text, logprobs=[])
                + self._response_event(
                    "response.content_part.done", sequence + 1, part=self._output_text(text)
                )
                + self._response_event(
                    "response.output_item.done", sequence + 2, item=self._output(text, "completed")
                )
                + self._response_event(
                    f"response.{self.finish_reason}", sequence + 3, response=done, timings=timings
                )
            )
        finish = self._envelope([self._choice(self.tokens, None)], chunk=True)
        chunks = [finish]
        if self.include_usage:
            chunks.append({**self._envelope([], chunk=True), "usage": self.usage(self.tokens)})
        chunks[-1]["timings"] = timings
        return b"".join(b"data: " + dumps(chunk) + b"\n\n" for chunk in chunks) + DONE

    def chunk(self, index: int, piece: str) -> bytes:
        """The SSE event for token ``index``."""
        if self.kind == "native":
            return b"data: " + dumps(self._native(piece, index + 1, stop=False)) + b"\n\n"
        if self.kind == "messages" and self.tool is not None:
            return self._input_json(json.dumps(piece)[1:-1])  # the next words, JSON-escaped
        if self.kind == "messages":
            delta = {"type": "text_delta", "text": piece}
            return _event("content_block_delta", {"index": 0, "delta": delta})
        if self.kind == "responses":
            return self._response_event(
                "response.output_text.delta", 4 + index, delta=piece, logprobs=[]
            )
        return (
            b"data: " + dumps(self._envelope([self._choice(index, piece)], chunk=True)) + b"\n\n"
        )

    def _choice(self, index: int, piece: str | None) -> dict[str, Any]:
        """Token ``index``'s choice; ``piece=None``: the closing ``finish_reason`` one."""
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat" and self.tool is not None:
            # The arguments' next words, JSON-escaped; the closing piece ends the object.
            arguments = '"}' if piece is None else json.dumps(piece)[1:-1]
            choice["delta"] = {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
        elif self.kind == "chat":
            delta: dict[str, str] = {} if piece is None else {"content": piece}
            if index == 0 and piece is not None:
                delta = {"role": "assistant", **delta}
            choice["delta"] = delta
        else:
            choice.update(text=piece or "", logprobs=None)
        choice["finish_reason"] = self.finish_reason if piece is None else None
        return choice


def _event(kind: str, data: dict[str, Any]) -> bytes:
    """A named SSE event, as Anthropic's Messages streams send them."""
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **data}) + b"\n\n"


def _phase(name: str, tokens: int, seconds: float) -> dict[str, Any]:
    """One phase of llama-server's ``timings``: ``NAME_n``, ``NAME_ms``,
    ``NAME_per_token_ms`` and ``NAME_per_second``."""
    seconds = max(seconds, 1e-6)  # never a division by zero, even on a coarse clock
    return {
        f"{name}_n": tokens,
        f"{name}_ms": round(seconds * 1000, 3),
        f"{name}_per_token_ms": round(seconds * 1000 / tokens, 3) if tokens else 0.0,
        f"{name}_per_second": round(tokens / seconds, 3),
    }
