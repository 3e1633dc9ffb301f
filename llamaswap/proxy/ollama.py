"""Ollama's API over OpenAI's: ``ollama = "translate"`` (the default).

Some clients speak only Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``):
editor plugins, automation tools, scripts written with the ``ollama`` package. For a model
whose ``ollama`` key is ``"translate"``, llamaswap turns such a request into the OpenAI one
every model server here speaks (:func:`translate`), and the answer back: a whole one with
:meth:`Translation.whole`, a stream line by line with :class:`Stream` (Ollama streams
newline-delimited JSON, and streams unless the request says ``"stream": false``). With
``ollama = "native"`` the request goes to the model server as sent (a server that is
itself Ollama).

What maps, and what does not:

* ``options``: the sampling ones that llama-server and vLLM take under Ollama's own names
  are sent as they are (:data:`SAMPLING`), ``num_predict`` becomes ``max_tokens``. The
  others say how a server loads its model (``num_ctx``, ``num_gpu``, ...): the model's
  ``cmd`` says that here, so they are dropped. ``keep_alive`` is dropped too: a model's
  ``ttl`` decides when it unloads.
* ``format``: ``"json"`` asks for a JSON object, a JSON schema for that schema.
* ``images`` (base64) become the message's image parts; ``tool_calls`` and ``tool``
  messages are OpenAI's, with call IDs made up and matched by the tool's name.
* ``/api/generate`` applies the model's chat template (a user message, with ``system``
  before it) unless ``raw`` asks for the prompt as written (``/v1/completions``).
  ``template``, ``suffix`` and ``context`` have no OpenAI counterpart and are refused
  with a 400 that says so, rather than ignored: the answer would not be what was asked.
* A chat with no messages, or a generate with an empty prompt, loads the model and
  answers ``"done_reason": "load"``, as Ollama does.
* The answer's counts come from ``usage`` and its durations (nanoseconds) from
  llama-server's ``timings`` where the server sends them; ``total_duration`` is
  llamaswap's own measure, from the request's arrival.

Pure functions and values, no I/O: ``forward.py`` sends and relays the bytes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, final

import attrs

from llamaswap.errors import BadRequest

from .sse import SseData, json_chunk

__all__ = [
    "NDJSON",
    "PATHS",
    "ROUTES",
    "SAMPLING",
    "Stream",
    "Translation",
    "translate",
]

CHAT_PATH = "/api/chat"
GENERATE_PATH = "/api/generate"
EMBED_PATH = "/api/embed"
EMBEDDINGS_PATH = "/api/embeddings"  # Ollama's older embedding route: one prompt
#: The routes answered by way of OpenAI's.
PATHS = frozenset({CHAT_PATH, GENERATE_PATH, EMBED_PATH, EMBEDDINGS_PATH})
#: Every route of Ollama's API that llamaswap serves: their errors are Ollama's
#: ``{"error": MESSAGE}``, the message a string where OpenAI's error is an object.
ROUTES = PATHS | {"/api/tags", "/api/ps", "/api/show"}

_OPENAI_CHAT = "/v1/chat/completions"
_OPENAI_COMPLETIONS = "/v1/completions"
_OPENAI_EMBEDDINGS = "/v1/embeddings"

#: The content type of Ollama's streams: one JSON document a line.
NDJSON = "application/x-ndjson"

#: Ollama's sampling options that llama-server (and vLLM, most of them) read under the same
#: name in an OpenAI request.
SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "seed",
    "stop",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
)

#: The first characters of a base64 image, by its type (Ollama sends images without one).
_IMAGE_TYPES = (
    ("iVBORw0KGgo", "image/png"),
    ("/9j/", "image/jpeg"),
    ("R0lGOD", "image/gif"),
    ("UklGR", "image/webp"),
)

_REFUSED = {
    "template": "llamaswap cannot change a model server's prompt template: leave out "
    "'template', or send the whole prompt with \"raw\": true",
    "suffix": "fill-in-the-middle ('suffix') has no OpenAI counterpart: use llama-server's "
    "/infill route",
    "context": "'context' (an earlier answer's tokens) has no OpenAI counterpart: send the "
    "conversation to /api/chat",
}


def _wall_now() -> str:
    """Now, as Ollama writes ``created_at`` (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@attrs.frozen
class Translation:
    """What the answer's conversion needs to know about the request."""

    path: str  # the Ollama route: CHAT_PATH, GENERATE_PATH, EMBED_PATH or EMBEDDINGS_PATH
    model: str  # the name the client asked for, echoed in the answer
    stream: bool  # the client asked for a stream (and the server was asked for one)
    raw: bool = False  # /api/generate with "raw": the prompt went to /v1/completions
    loads_only: bool = False  # nothing to generate: answered once the model is loaded
    #: Clocks (tests set them): a monotonic one in nanoseconds, and ``created_at``'s.
    clock: Callable[[], int] = attrs.field(default=time.monotonic_ns, eq=False)
    wall: Callable[[], str] = attrs.field(default=_wall_now, eq=False)
    #: ``clock()`` when the request was translated: ``total_duration`` counts from here.
    started: int = attrs.field(default=attrs.Factory(lambda self: self.clock(), takes_self=True))

    @property
    def upstream_path(self) -> str:
        if self.path in (EMBED_PATH, EMBEDDINGS_PATH):
            return _OPENAI_EMBEDDINGS
        return _OPENAI_COMPLETIONS if self.raw else _OPENAI_CHAT

    #: The content type of a translated stream.
    stream_type = NDJSON

    def whole(self, answer: object) -> dict[str, Any]:
        """A whole OpenAI answer as Ollama's.

        Raises:
            ValueError: ``answer`` is not what the OpenAI route answers (no choice, no
                embedding), or a tool call's arguments are not a JSON object.
        """
        if self.path in (EMBED_PATH, EMBEDDINGS_PATH):
            return self._embeddings(answer)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(answer, dict) or not isinstance(choices, list) or not choices:
            raise ValueError("the model's answer has no 'choices'")
        choice = _object(choices[0])
        message = _object(choice.get("message"))
        text = choice.get("text") if self.raw else message.get("content")
        document = self.head(text if isinstance(text, str) else "", _thinking(message))
        if calls := _list(message.get("tool_calls")):
            document["message"]["tool_calls"] = [_tool_call(call) for call in calls]
        return document | self.end(choice.get("finish_reason"), answer)

    def stream_lines(self) -> Stream:
        """The converter of the server's event stream."""
        return Stream(self)

    def loaded(self) -> dict[str, Any]:
        """The answer to a request with nothing to generate, once its model is loaded."""
        return self.head("", "") | {"done": True, "done_reason": "load"}

    def head(self, text: str, thinking: str) -> dict[str, Any]:
        """An answer's first fields: what it says so far."""
        document: dict[str, Any] = {"model": self.model, "created_at": self.wall()}
        if self.path == CHAT_PATH:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            document["message"] = message
        else:
            document["response"] = text
            if thinking:
                document["thinking"] = thinking
        document["done"] = False
        return document

    def end(self, finish: object, usage_from: dict[str, Any]) -> dict[str, Any]:
        """An answer's last fields: why it ended, its counts and durations."""
        end: dict[str, Any] = {
            "done": True,
            "done_reason": "length" if finish == "length" else "stop",
            "total_duration": max(0, self.clock() - self.started),
        }
        usage = _object(usage_from.get("usage"))
        timings = _object(usage_from.get("timings"))  # llama-server's
        for count, duration, tokens, ms in (
            ("prompt_eval_count", "prompt_eval_duration", "prompt_tokens", "prompt_ms"),
            ("eval_count", "eval_duration", "completion_tokens", "predicted_ms"),
        ):
            if isinstance(usage.get(tokens), int):
                end[count] = usage[tokens]
            if isinstance(timings.get(ms), int | float):
                end[duration] = round(timings[ms] * 1_000_000)
        return end

    def _embeddings(self, answer: object) -> dict[str, Any]:
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(answer, dict) or not isinstance(data, list):
            raise ValueError("the model's answer has no 'data'")
        items = sorted((_object(item) for item in data), key=lambda item: item.get("index", 0))
        vectors = [item.get("embedding") for item in items]
        if not all(isinstance(vector, list) for vector in vectors):
            raise ValueError("the model's answer has an embedding that is not a list of numbers")
        if self.path == EMBEDDINGS_PATH:
            return {"embedding": vectors[0] if vectors else []}
        document: dict[str, Any] = {"model": self.model, "embeddings": vectors}
        document["total_duration"] = max(0, self.clock() - self.started)
        tokens = _object(answer.get("usage")).get("prompt_tokens")
        if isinstance(tokens, int):
            document["prompt_eval_count"] = tokens
        return document


@final
class Stream:
    """A chat-completions (or completions) event stream, fed as it arrives, re-told as
    Ollama's lines.

    ``feed`` takes the server's bytes in any pieces and returns the lines they complete;
    ``close`` returns the last line (``"done": true`` with the counts), unless the server's
    stream carried an error. Tool calls come whole in one line before it, as Ollama sends
    them: their arguments arrive in pieces and only the whole is a JSON object.
    """

    def __init__(self, translation: Translation) -> None:
        self._translation = translation
        self._events = SseData()
        self._calls: dict[object, dict[str, str]] = {}  # by index: name, arguments so far
        self._finish: object = None
        self._last: dict[str, Any] = {}  # where usage and timings came
        self._done = False

    def feed(self, data: bytes) -> bytes:
        return b"".join(self._event(event) for event in self._events.feed(data))

    def close(self) -> bytes:
        """The answer's last lines, once the server's stream has ended."""
        out = bytearray(b"".join(self._event(event) for event in self._events.close()))
        if self._done:
            return bytes(out)
        self._done = True
        if self._calls:
            head = self._translation.head("", "")
            if "message" in head:
                head["message"]["tool_calls"] = [
                    _tool_call({"function": call}) for call in self._calls.values()
                ]
                out += _line(head)
        end = self._translation.end(self._finish, self._last)
        out += _line(self._translation.head("", "") | end)
        return bytes(out)

    def _event(self, data: bytes) -> bytes:
        if self._done or (chunk := json_chunk(data)) is None:
            return b""
        if "error" in chunk:  # llama-server reports a failure mid-stream so
            self._done = True
            error = chunk["error"]
            message = _object(error).get("message", error)
            return _line({"error": str(message)})
        if chunk.get("usage") is not None:
            self._last["usage"] = chunk["usage"]
        if chunk.get("timings") is not None:
            self._last["timings"] = chunk["timings"]
        out = bytearray()
        for choice in _list(chunk.get("choices")):
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = _object(choice.get("delta"))
            text = choice.get("text") if self._translation.raw else delta.get("content")
            text = text if isinstance(text, str) else ""
            thinking = _thinking(delta)
            if text or thinking:
                out += _line(self._translation.head(text, thinking))
            for call in _list(delta.get("tool_calls")):
                self._add_call(_object(call))
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
        return bytes(out)

    def _add_call(self, call: dict[str, Any]) -> None:
        function = _object(call.get("function"))
        found = self._calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
        if isinstance(name := function.get("name"), str):
            found["name"] += name
        if isinstance(arguments := function.get("arguments"), str):
            found["arguments"] += arguments


def translate(
    path: str, body: dict[str, Any], *, model: str
) -> tuple[bytes, dict[str, Any], Translation]:
    """Ollama's request for ``path`` (one of :data:`PATHS`), for ``model`` (its ``model``,
    or the default model), as an OpenAI one: its JSON bytes, the document, and what the
    answer's conversion needs.

    Raises:
        BadRequest: the request has a field that does not translate, or one of the wrong
            type, or nests too deeply to write out again.
    """
    if path in (EMBED_PATH, EMBEDDINGS_PATH):
        request, translation = _embedding(path, body, model)
    else:
        request, translation = _generation(path, body, model)
    try:
        raw_request = json.dumps(request, separators=(",", ":")).encode()
    except RecursionError as exc:  # read at the edge of the limit, deeper once converted
        raise BadRequest("the request nests too deeply") from exc
    return raw_request, request, translation


def _embedding(path: str, body: dict[str, Any], model: str) -> tuple[dict[str, Any], Translation]:
    """``/api/embed`` or ``/api/embeddings`` as a ``/v1/embeddings`` request."""
    request: dict[str, Any] = {"model": model, "input": _embedding_input(path, body)}
    if isinstance(body.get("dimensions"), int):
        request["dimensions"] = body["dimensions"]
    return request, Translation(path, model, stream=False)


def _generation(path: str, body: dict[str, Any], model: str) -> tuple[dict[str, Any], Translation]:
    """``/api/chat`` or ``/api/generate`` as a chat-completions (or, ``raw``, a
    completions) request."""
    if path == GENERATE_PATH:
        for name, reason in _REFUSED.items():
            if body.get(name):
                raise BadRequest(reason, param=name)
    raw = path == GENERATE_PATH and body.get("raw") is True
    request: dict[str, Any] = {"model": model}
    if path == CHAT_PATH:
        request["messages"] = _messages(body.get("messages"))
        empty = not request["messages"]
    elif raw:
        if body.get("images"):
            raise BadRequest("images need the model's chat template: leave out 'raw'")
        request["prompt"] = _string(body, "prompt")
        empty = not request["prompt"]
    else:
        request["messages"] = _prompt_messages(body)
        empty = not _string(body, "prompt") and not body.get("images")
    stream = body.get("stream", True) is not False
    request["stream"] = stream
    if stream:
        request["stream_options"] = {"include_usage": True}
    request |= _sampling(body.get("options"))
    if (response_format := _format(body.get("format"))) is not None:
        request["response_format"] = response_format
    if path == CHAT_PATH and (tools := body.get("tools")):
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be an array", param="tools")
        request["tools"] = tools
    return request, Translation(path, model, stream=stream, raw=raw, loads_only=empty)


def _messages(messages: object) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's."""
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be an array", param="messages")
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (name, id) of calls not yet answered
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(
                f"{where}.role must be system, user, assistant or tool, got {role!r}",
                param=f"{where}.role",
            )
        item: dict[str, Any] = {"role": role, "content": _content(message, where)}
        calls = _list(message.get("tool_calls"))
        if calls and role == "assistant":
            item["tool_calls"] = []
            for number, call in enumerate(calls):
                function = _object(_object(call).get("function"))
                name = function.get("name")
                if not isinstance(name, str):
                    raise BadRequest(f"{where}.tool_calls[{number}] names no function")
                arguments = function.get("arguments", {})
                call_id = f"call_{index}_{number}"
                open_calls.append((name, call_id))
                item["tool_calls"].append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                )
        if role == "tool":
            item["tool_call_id"] = _answered(message.get("tool_name"), open_calls)
        out.append(item)
    return out


def _answered(name: object, open_calls: list[tuple[str, str]]) -> str:
    """The ID of the call a tool message answers: the first open call of its tool (or the
    first open call, for a message that names none), made up if none is open."""
    for number, (called, call_id) in enumerate(open_calls):
        if name is None or called == name:
            del open_calls[number]
            return call_id
    return f"call_{name if isinstance(name, str) else 'tool'}"


def _content(message: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    """A message's text, with its images as parts after it."""
    text = message.get("content", "")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise BadRequest(f"{where}.content must be a string", param=f"{where}.content")
    images = message.get("images") or []
    if not images:
        return text
    if not isinstance(images, list) or not all(isinstance(image, str) for image in images):
        raise BadRequest(f"{where}.images must be base64 strings", param=f"{where}.images")
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in images:
        kind = next((kind for start, kind in _IMAGE_TYPES if image.startswith(start)), None)
        url = f"data:{kind or 'image/png'};base64,{image}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _prompt_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``/api/generate``'s ``system`` and ``prompt`` (with its ``images``) as chat messages."""
    messages: list[dict[str, Any]] = []
    if system := _string(body, "system"):
        messages.append({"role": "system", "content": system})
    user = {"content": _string(body, "prompt"), "images": body.get("images")}
    messages.append({"role": "user", "content": _content(user, "request")})
    return messages


def _embedding_input(path: str, body: dict[str, Any]) -> str | list[str]:
    if path == EMBEDDINGS_PATH:
        return _string(body, "prompt")
    text = body.get("input", "")
    if isinstance(text, str) or (
        isinstance(text, list) and all(isinstance(item, str) for item in text)
    ):
        return text
    raise BadRequest("'input' must be a string or an array of strings", param="input")


def _sampling(options: object) -> dict[str, Any]:
    """Ollama's ``options`` that an OpenAI request can carry."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise BadRequest("'options' must be an object", param="options")
    sampling = {name: options[name] for name in SAMPLING if name in options}
    predict = options.get("num_predict")
    if isinstance(predict, int) and predict >= 0:  # -1: no limit, -2: fill the context
        sampling["max_tokens"] = predict
    return sampling


def _format(response_format: object) -> dict[str, Any] | None:
    if response_format is None or response_format == "":
        return None
    if response_format == "json":
        return {"type": "json_object"}
    if isinstance(response_format, dict):
        schema = {"name": "format", "schema": response_format}
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequest("'format' must be \"json\" or a JSON schema", param="format")


def _tool_call(call: object) -> dict[str, Any]:
    """An OpenAI tool call as Ollama's, whose arguments are an object, not its text.

    Raises:
        ValueError: the arguments are not a JSON object.
    """
    function = _object(_object(call).get("function"))
    arguments = function.get("arguments") or "{}"
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError("a tool call's arguments are not a JSON object")
    return {"function": {"name": function.get("name", ""), "arguments": arguments}}


def _thinking(message: dict[str, Any]) -> str:
    """The reasoning a server sends beside the answer (llama-server's
    ``reasoning_content``, vLLM's ``reasoning``)."""
    for name in ("reasoning_content", "reasoning"):
        if isinstance(text := message.get(name), str) and text:
            return text
    return ""


def _string(body: dict[str, Any], name: str) -> str:
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string", param=name)
    return value


def _line(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode() + b"\n"


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
