"""A generation that can be checkpointed and resumed: what a preempted request keeps.

Under ``serial`` with ``preempt``, a request the scheduler preempts has its upstream
request ended mid-generation (the model server sees the connection close and stops), and
later goes on where it stopped. ``Generation`` is the pure part of that: it decides
whether a request can be resumed exactly enough (``generation``), asks the model server
for an event stream whatever the client asked (a whole answer cannot be cut in two),
reads each event as it passes (the text so far, llama.cpp's token ids, the finish and the
usage), writes the next segment's request (``body``), and makes the segments one answer:

* a streaming client gets one stream: every event of a later segment carries the first
  segment's ``id`` and ``created``, its opening role-only chunk is dropped, and its
  ``usage`` counts the original prompt once and every generated token once;
* a client that did not stream gets one whole answer (``answer``), built from the events.

How a segment goes on from the text so far (``body``):

* ``/v1/chat/completions``: the partial answer as a final assistant message (appended to
  one the client already ended with), which llama-server prefills;
  ``continue_final_message`` and ``add_generation_prompt = false`` ask vLLM for the same;
* ``/v1/completions``: the prompt with the text appended;
* llama.cpp's ``/completion``: the prompt with the generated token ids appended (asked for
  with ``return_tokens``; llama-server takes a prompt of strings and ids mixed), so no
  text is tokenized again; the text where no ids came back;

and ``max_tokens`` (``max_completion_tokens``, ``n_predict``) less what was generated.
Tokens are counted as events with text (llama-server sends one a token) or, for
``/completion``, as the ids returned.

What cannot be resumed exactly is never preempted: several choices (``n``), log
probabilities, ``echo``, ``suffix``, several prompts, a final message that is not text;
and a request whose answer began a tool call or reasoning is pinned from then on
(``pinned``): the forwarder tells the scheduler, and reads it to its end (for a client
that did not stream, the reasoning and the tool calls are put together in the answer).
"""

from __future__ import annotations

import enum
import json
from typing import Any, Final, TypeGuard, final

__all__ = ["Generation", "Kind", "generation"]

CHAT_PATH: Final = "/v1/chat/completions"
COMPLETIONS_PATH: Final = "/v1/completions"
NATIVE_PATH: Final = "/completion"


class Kind(enum.Enum):
    CHAT = CHAT_PATH
    COMPLETIONS = COMPLETIONS_PATH
    NATIVE = NATIVE_PATH


#: Body fields that ask for what a resumed answer cannot give exactly.
_INEXACT: Final = ("logprobs", "top_logprobs", "n_probs", "echo", "suffix", "best_of")
#: The token limits, by kind: each is lowered by what was generated.
_LIMITS: Final = {
    Kind.CHAT: ("max_tokens", "max_completion_tokens"),
    Kind.COMPLETIONS: ("max_tokens",),
    Kind.NATIVE: ("n_predict",),
}


def generation(path: str, document: dict[str, Any]) -> Generation | None:
    """A resumable generation for a request to ``path`` with the JSON body ``document``,
    or None where resuming it would not give the answer it would have had."""
    try:
        kind = Kind(path)
    except ValueError:
        return None
    if document.get("n", 1) != 1 or any(document.get(name) for name in _INEXACT):
        return None
    if kind is Kind.CHAT:
        if document.get("functions") and document.get("stream") is not True:
            return None  # legacy function calls: not assembled from events here
        messages = document.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        last = messages[-1]
        if not isinstance(last, dict):
            return None
        if last.get("role") == "assistant" and not isinstance(last.get("content"), str):
            return None
    elif kind is Kind.COMPLETIONS:
        if not isinstance(document.get("prompt"), str):
            return None
    elif not isinstance(document.get("prompt"), (str, list)):
        return None
    limits = (document.get(name) for name in _LIMITS[kind])
    if any(limit is not None and not _count(limit) for limit in limits):
        return None
    return Generation(kind, document)


def _count(value: object) -> TypeGuard[int]:
    """A token limit llamaswap can lower: absent or an integer (``-1``: no limit)."""
    return isinstance(value, int) and not isinstance(value, bool)


@final
class Generation:
    """One resumable request's generation, across its segments. Feed it the upstream's
    bytes (``feed``), mark the end of a segment cut short (``checkpoint``), ask it for
    the next segment's body (``body``) and, for a client that did not stream, the whole
    answer at the end (``answer``)."""

    def __init__(self, kind: Kind, document: dict[str, Any]) -> None:
        self.kind = kind
        self._original = document
        self.client_streams = document.get("stream") is True
        options = document.get("stream_options")
        self.client_usage = isinstance(options, dict) and options.get("include_usage") is True
        self._client_tokens = document.get("return_tokens") is True
        #: The text generated so far, and its token count (and ids, for ``/completion``).
        self.text = ""
        self.tokens = 0
        self.ids: list[int] = []
        #: Tokens generated before the segment in progress (its prefill).
        self._before = 0
        self.segments = 0
        #: Prompt tokens read again by the segments after the first.
        self.recomputed = 0
        #: A tool call or reasoning began: it cannot be resumed.
        self.pinned = False
        self._reasoning = ""  # a chat's reasoning_content, and its tool calls by index
        self._calls: dict[int, dict[str, Any]] = {}
        self._model = document.get("model")
        self._id: object = None
        self._created: object = None
        self._finish: object = None
        #: The whole answer's ``usage`` (the last segment's, as ``_totals`` made it).
        self.usage: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None  # the last event (/completion's final)
        self._timings: object = None
        self._start = 0  # where the segment in progress begins in ``text``
        self._pending = b""
        self._dropped = False  # an event's data line was dropped: so is its blank line

    # ---------------------------------------------------------------- requests

    def body(self) -> bytes:
        """The next segment's request body: the original, streaming, and from the second
        segment on, continuing from what was generated."""
        document = dict(self._original)
        document["stream"] = True
        if self.kind is not Kind.NATIVE:
            document["stream_options"] = {"include_usage": True}
        else:
            document["return_tokens"] = True
        if self.tokens:
            self._continue(document)
        self._before, self._start = self.tokens, len(self.text)
        self._pending = b""
        self.segments += 1
        return json.dumps(document).encode()

    def _continue(self, document: dict[str, Any]) -> None:
        for name in _LIMITS[self.kind]:
            limit = document.get(name)
            if isinstance(limit, int) and limit >= 0:
                document[name] = max(limit - self.tokens, 0)
        if self.kind is Kind.CHAT:
            messages = list(document["messages"])
            last = messages[-1]
            if last.get("role") == "assistant":  # the client's own prefill, continued
                messages[-1] = {**last, "content": last["content"] + self.text}
            else:
                messages.append({"role": "assistant", "content": self.text})
            document["messages"] = messages
            document["continue_final_message"] = True
            document["add_generation_prompt"] = False
        elif self.kind is Kind.COMPLETIONS:
            document["prompt"] += self.text
        else:
            prompt = document["prompt"]
            prompt = prompt if isinstance(prompt, list) else [prompt]
            exact = len(self.ids) == self.tokens
            document["prompt"] = [*prompt, *self.ids] if exact else [*prompt, self.text]

    # ------------------------------------------------------------------ events

    def feed(self, data: bytes) -> bytes:
        """Read a piece of the upstream's event stream; returns what the client is sent
        of it (nothing for a client that did not stream)."""
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        out = []
        for line in lines:
            line = line.rstrip(b"\r")
            if not line and self._dropped:
                self._dropped = False
                continue
            kept = self._line(line)
            if kept is not None:
                out.append(kept)
            else:
                self._dropped = True
        return b"\n".join(out) + b"\n" if out and self.client_streams else b""

    def checkpoint(self) -> None:
        """The segment was cut short: what arrived of an unfinished event is dropped."""
        self._pending = b""

    def _line(self, line: bytes) -> bytes | None:
        if not line.startswith(b"data:"):
            return line  # blank lines end events; comments and event names pass
        data = line[5:].strip()
        if data == b"[DONE]":
            return line
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            return line
        if not isinstance(event, dict):
            return line
        if self._read(event):
            return b"data: " + json.dumps(event, separators=(",", ":")).encode()
        return None

    def _read(self, event: dict[str, Any]) -> bool:
        """Take in one event, rewriting it for the client; False to drop it."""
        if self._id is None:
            self._id, self._created = event.get("id"), event.get("created")
            self._model = event.get("model", self._model)
        elif self.segments > 1:
            if "id" in event:
                event["id"] = self._id
            if "created" in event:
                event["created"] = self._created
        if "timings" in event:
            self._timings = event["timings"]
        if self.kind is Kind.NATIVE:
            return self._native(event)
        text = None
        bare = True  # nothing but the role, and no text: a stream's opening chunk
        choices = event.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if isinstance(choice, dict):
            if self.kind is Kind.CHAT:
                delta = choice.get("delta")
                delta = delta if isinstance(delta, dict) else {}
                self._aside(delta)
                text = delta.get("content")
                bare = set(delta) <= {"role", "content"}
                if self.segments > 1:
                    delta.pop("role", None)  # the first segment's opening said it once
            else:
                text = choice.get("text")
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
                bare = False
        if isinstance(text, str) and text:
            self.text += text
            self.tokens += 1
        usage = event.get("usage")
        if isinstance(usage, dict):
            event["usage"] = self.usage = self._totals(usage)
            if not self.client_usage and not choices:
                return False  # asked for by llamaswap, not by the client
        # A later segment's opening chunk says again what the first one said.
        resumed = self.segments > 1 and self.tokens == self._before
        opening = resumed and isinstance(choice, dict) and bare and not text
        return not (opening and "usage" not in event and "timings" not in event)

    def _aside(self, delta: dict[str, Any]) -> None:
        """A chat delta's reasoning and tool calls, which pin the request (they cannot be
        continued from text), kept for a client that did not stream."""
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self.pinned = True
            self._reasoning += reasoning
        calls = delta.get("tool_calls")
        if delta.get("function_call") or (isinstance(calls, list) and calls):
            self.pinned = True
        for call in calls if isinstance(calls, list) else ():
            if not isinstance(call, dict):
                continue
            index = call.get("index", 0)
            kept = self._calls.setdefault(
                index if isinstance(index, int) else 0,
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            for field in ("id", "type"):
                if isinstance(call.get(field), str):
                    kept[field] = call[field]
            function = call.get("function")
            for field in ("name", "arguments"):
                if isinstance(function, dict) and isinstance(function.get(field), str):
                    kept["function"][field] += function[field]

    def _native(self, event: dict[str, Any]) -> bool:
        content = event.get("content")
        if isinstance(content, str) and content:
            self.text += content
        ids = event.get("tokens")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids) and ids:
            self.ids.extend(ids)
            self.tokens += len(ids)
        elif isinstance(content, str) and content:
            self.tokens += 1
        if not self._client_tokens:
            event.pop("tokens", None)
        if event.get("stop") is True:
            predicted, evaluated = event.get("tokens_predicted"), event.get("tokens_evaluated")
            if _count(predicted):
                event["tokens_predicted"] = predicted + self._before
            if _count(evaluated):
                if self.segments > 1:
                    self.recomputed += _prompt_read(self._timings, evaluated)
                event["tokens_evaluated"] = max(evaluated - self._before, 0)
            self._last = event
        return True

    def _totals(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The segment's ``usage`` as the whole answer's: the prompt it read less the
        prefill, every token generated."""
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not (_count(prompt) and _count(completion)):
            return usage
        if self.segments > 1:
            self.recomputed += _prompt_read(self._timings, prompt)
        prompt = max(prompt - self._before, 0)
        completion += self._before
        return {**usage, "prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}  # fmt: skip

    @property
    def repeated(self) -> bool:
        """The segment in progress, a resumed one, began with the whole text before it:
        its server answered from the start, ignoring what it was asked to continue. (A
        request preempted before its first token had nothing to continue.)"""
        before = self.text[: self._start]
        return self.segments > 1 and bool(before) and self.text.startswith(before, self._start)

    # ------------------------------------------------------------------ answer

    def answer(self) -> dict[str, Any]:
        """The whole answer, for a client that did not stream."""
        if self.kind is Kind.NATIVE:
            document = dict(self._last or {})
            document["content"] = self.text
            if self._client_tokens:
                document["tokens"] = self.ids
            return document
        choice: dict[str, Any] = {"index": 0, "finish_reason": self._finish}
        if self.kind is Kind.CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": self.text}
            if self._reasoning:
                message["reasoning_content"] = self._reasoning
            if self._calls:
                message["content"] = self.text or None
                message["tool_calls"] = [self._calls[index] for index in sorted(self._calls)]
            choice["message"] = message
            kind = "chat.completion"
        else:
            choice.update(text=self.text, logprobs=None)
            kind = "text_completion"
        document = {
            "id": self._id,
            "object": kind,
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }
        if self.usage is not None:
            document["usage"] = self.usage
        if self._timings is not None:
            document["timings"] = self._timings
        return document


def _prompt_read(timings: object, prompt: int) -> int:
    """How many prompt tokens the model server read: llama.cpp's ``timings.prompt_n``
    (less than the prompt where its cache held the rest), else the whole prompt."""
    if isinstance(timings, dict) and _count(timings.get("prompt_n")):
        return int(timings["prompt_n"])
    return prompt
