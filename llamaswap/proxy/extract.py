"""Reading the model from a request, and rewriting the request for its model server.

Inference routes name their model in the body or in the query string (SPEC §4.1). A body's
``Content-Type`` says how it is read (``body_kind``): a JSON object, a multipart form
(``/v1/audio/transcriptions``, an image edit) or a URL-encoded form (what an HTML form
posts), each with a ``model`` field; a body that says none is read as its route expects. A
form's ``model`` is rewritten in place, every other byte kept. ``useModelName`` and
``filters`` rewrite the JSON body; when nothing changes, the original bytes are forwarded
untouched. A JSON body is parsed once per request (``Payload``), however many questions are
asked of it: a prompt with images can be megabytes. Most requests only need its ``model``
(and ``stream``): those two fields are read with msgspec, which checks the whole body is
JSON but builds nothing else (a 2 MB chat body: 0.55 ms, against 4.7 ms for ``json.loads``;
docs/performance.md), then the body is checked to be UTF-8, as RFC 8259 requires and
msgspec checks only in what it reads (``_check_utf8``: 0.07 ms more for an ASCII body).
Whatever msgspec cannot read goes to ``json.loads``, which decides as it always did (it
takes ``NaN`` and ``Infinity``, as clients may send them). A rewrite changes top-level keys
only: the other values go upstream byte for byte, as the client wrote them (a number such
as ``1e400`` or one of 5 000 digits as it is: a document would make it ``Infinity``, or
fail).
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, Literal, final
from urllib.parse import parse_qsl, quote_plus, unquote_plus, urlencode

import attrs
import msgspec
from werkzeug.sansio.multipart import (
    Data,
    Epilogue,
    Field,
    File,
    MultipartDecoder,
    MultipartEncoder,
    NeedData,
)

from llamaswap.config.model import FilterConfig
from llamaswap.errors import BadRequest

__all__ = ["ModelIn", "Payload", "body_kind", "read_model", "rewrite_body", "rewrite_query"]


class ModelIn(enum.Enum):
    JSON = "json"
    MULTIPART = "multipart"
    FORM = "form"  # application/x-www-form-urlencoded
    QUERY = "query"


#: The body kinds a ``Content-Type`` names (its media type, in lower case).
_MEDIA_TYPES = {
    "application/json": ModelIn.JSON,
    "multipart/form-data": ModelIn.MULTIPART,
    "application/x-www-form-urlencoded": ModelIn.FORM,
}


def body_kind(where: ModelIn, content_type: str) -> ModelIn:
    """How a request to a route whose model is ``where`` names it: a body route reads the
    body its ``Content-Type`` says it is (JSON, a multipart form or a URL-encoded form,
    as llama-swap reads them), else the kind the route expects; a query route reads the
    query whatever its body."""
    if where is ModelIn.QUERY:
        return where
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type.endswith("+json"):
        return ModelIn.JSON
    return _MEDIA_TYPES.get(media_type, where)


class _Head(msgspec.Struct):
    """The fields of a JSON body that every request is asked for."""

    model: Any = None
    stream: Any = None


_HEAD = msgspec.json.Decoder(_Head)
#: A JSON object's top level, each value as the bytes it was written in.
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])


@final
@attrs.define(eq=False)
class Payload:
    """A request body read into memory; its JSON document is parsed on first use only."""

    raw: bytes
    content_type: str
    _document: dict[str, Any] | None = None
    _head: _Head | None = None

    def json(self) -> dict[str, Any]:
        """The body as a JSON object. Raises BadRequest if it is not one."""
        if self._document is None:
            self._document = _json_object(self.raw)
        return self._document

    def field(self, name: Literal["model", "stream"]) -> object:
        """``json().get(name)`` for ``model`` or ``stream``, without building the document."""
        if self._document is None and self._head is None:
            try:
                head = _HEAD.decode(self.raw)
            except (msgspec.MsgspecError, RecursionError):  # json.loads decides (NaN, BOMs…)
                self.json()
            else:
                _check_utf8(self.raw)  # in what msgspec skipped: it checks only what it reads
                self._head = head
        if self._document is not None:
            return self._document.get(name)
        return getattr(self._head, name)


def read_model(
    where: ModelIn, payload: Payload, query: bytes, *, default: str | None = None
) -> str:
    """The model named by the request; ``default`` when it names none (no ``model``,
    or an empty one).

    Raises:
        BadRequest: the body is not JSON (or not a form), its ``model`` is not a string,
            or it names no model and there is no ``default``.
    """
    model: object  # a JSON body may hold anything there
    if where is ModelIn.QUERY:
        model = dict(parse_qsl(query.decode("latin-1"))).get("model")
    elif where is ModelIn.JSON:
        model = payload.field("model")
    elif where is ModelIn.FORM:
        model = _urlencoded_fields(payload.raw).get("model")
    else:
        model = _form_fields(payload.raw, payload.content_type).get("model")
    if model is not None and not isinstance(model, str):
        kind = _JSON_KINDS.get(type(model), type(model).__name__)
        raise BadRequest(f"'model' must be a string (a model's name), got {kind}", param="model")
    if model:
        return model
    if default is not None:
        return default
    fix = "add ?model=NAME to the URL" if where is ModelIn.QUERY else "set the 'model' field"
    raise BadRequest(
        f"the request names no model: {fix}, or set defaultModel in the config", param="model"
    )


#: JSON's names for the types ``json.loads`` gives.
_JSON_KINDS = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    list: "an array",
    dict: "an object",
}


def rewrite_body(
    where: ModelIn,
    payload: Payload,
    *,
    model: str | None,
    filters: FilterConfig | None = None,
    requested: str = "",
) -> Payload:
    """``payload`` with ``model`` set (unless ``None``) and the filters applied: those of
    ``setParamsByID`` for the name the client sent (``requested``) after ``setParams``."""
    filters = filters or FilterConfig()
    set_params = filters.params_for(requested)
    if where is ModelIn.JSON:
        if model is None and not filters.strip_params and not set_params:
            return payload
        encode: Callable[[dict[str, Any]], bytes] = msgspec.json.encode
        try:
            document: dict[str, Any] = _TOP_LEVEL.decode(payload.raw)
        except (msgspec.MsgspecError, RecursionError):  # json.loads decides (NaN, BOMs…)
            document, encode = dict(payload.json()), _dumps
        else:
            payload.field("model")  # the values go on as they are: checked as field() does
        for key in filters.strip_params:
            if key != "model":
                document.pop(key, None)
        for key, value in set_params.items():
            if key != "model":
                document[key] = value
        if model is not None:
            document["model"] = model
        try:
            raw = encode(document)
        except RecursionError as exc:  # read at the edge of the limit, one level deeper now
            raise BadRequest(_TOO_DEEP) from exc
        return Payload(raw, payload.content_type)
    if where is ModelIn.MULTIPART and model is not None:
        raw = _replace_form_field(payload.raw, payload.content_type, "model", model)
        return Payload(raw, payload.content_type)
    if where is ModelIn.FORM and model is not None:
        return Payload(_replace_urlencoded(payload.raw, "model", model), payload.content_type)
    return payload


def rewrite_query(query: bytes, model: str) -> bytes:
    pairs = [(k, model if k == "model" else v) for k, v in parse_qsl(query.decode("latin-1"))]
    return urlencode(pairs).encode("latin-1")


def _dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


_TOO_DEEP = "the request body nests arrays and objects too deeply to read"


def _check_utf8(body: bytes) -> None:
    """Raises BadRequest unless ``body`` is UTF-8 (RFC 8259 §8.1: JSON exchanged between
    systems is). msgspec checks the strings it decodes, not those it skips (a field
    llamaswap does not read, a value kept as it was written): they would go upstream as
    they came. An ASCII body is checked at memory speed, 0.07 ms for 2 MB; other text
    takes a decode, about 1.8 ms for 2 MB of Cyrillic and Chinese (the string it builds
    is the cost: Python has no check that builds none)."""
    if body.isascii():
        return
    try:
        body.decode()
    except UnicodeDecodeError as exc:
        raise BadRequest(_not_utf8(exc)) from exc


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return (
        f"the request body is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
        "JSON must be (RFC 8259): send it as UTF-8"
    )


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except UnicodeDecodeError as exc:
        raise BadRequest(_not_utf8(exc)) from exc
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # valid JSON, nested deeper than Python's recursion limit
        raise BadRequest(_TOO_DEEP) from exc
    except ValueError as exc:  # valid JSON with an integer beyond int_max_str_digits
        raise BadRequest(
            f"the request body holds a number with more than {sys.get_int_max_str_digits()} "
            "digits; llamaswap cannot read it"
        ) from exc
    if not isinstance(document, dict):
        raise BadRequest("the request body must be a JSON object")
    return document


def _boundary(content_type: str) -> bytes:
    for part in content_type.split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    raise BadRequest("expected a multipart/form-data body with a boundary")


#: The most fields and files a form may have, as werkzeug's own form parser allows: the
#: proxy reads a form on the event loop, and 100 000 tiny fields took it 2 s.
MAX_FORM_PARTS = 1000


def _events(body: bytes, content_type: str) -> list[Any]:
    decoder = MultipartDecoder(_boundary(content_type), max_form_memory_size=None)
    decoder.receive_data(body)
    decoder.receive_data(None)
    events: list[Any] = []
    parts = 0
    try:
        while not isinstance(event := decoder.next_event(), (Epilogue, NeedData)):
            events.append(event)
            if isinstance(event, (Field, File)) and (parts := parts + 1) > MAX_FORM_PARTS:
                raise BadRequest(f"the multipart form has more than {MAX_FORM_PARTS} parts")
    except ValueError as exc:
        raise BadRequest(f"the multipart form is malformed: {exc}") from exc
    return events


def _form_fields(body: bytes, content_type: str) -> Mapping[str, str]:
    fields: dict[str, str] = {}
    name: str | None = None
    for event in _events(body, content_type):
        if isinstance(event, Field):
            name = event.name
            fields[name] = ""
        elif isinstance(event, File):
            name = None
        elif isinstance(event, Data) and name is not None:
            fields[name] += event.data.decode("utf-8", errors="replace")
    return fields


def _replace_form_field(body: bytes, content_type: str, field: str, value: str) -> bytes:
    encoder = MultipartEncoder(_boundary(content_type))
    out = bytearray()
    replacing = False
    for event in _events(body, content_type):
        if isinstance(event, (Field, File)):
            replacing = isinstance(event, Field) and event.name == field
            out += encoder.send_event(event)
            if replacing:
                out += encoder.send_event(Data(data=value.encode(), more_data=False))
        elif isinstance(event, Data) and not replacing:
            out += encoder.send_event(event)
    out += encoder.send_event(Epilogue(data=b""))
    return bytes(out)


def _urlencoded_fields(body: bytes) -> Mapping[str, str]:
    """A URL-encoded form's fields, the first value of each (as Go's ``FormValue``).

    Raises:
        BadRequest: it is not UTF-8 (raw or once decoded), or has more than
            ``MAX_FORM_PARTS`` fields.
    """
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the form is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    try:
        pairs = parse_qsl(
            text, keep_blank_values=True, errors="strict", max_num_fields=MAX_FORM_PARTS
        )
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"the form is not UTF-8 once its %XX escapes are decoded ({exc.reason})"
        ) from exc
    except ValueError as exc:  # parse_qsl's limit
        raise BadRequest(f"the form has more than {MAX_FORM_PARTS} fields") from exc
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


def _replace_urlencoded(body: bytes, field: str, value: str) -> bytes:
    """``body`` with every value of ``field`` set to ``value``; every other field goes on
    byte for byte, as the client encoded it."""
    _urlencoded_fields(body)  # checked as read_model checks it
    encoded = f"{quote_plus(field)}={quote_plus(value)}".encode()
    parts = [
        encoded if unquote_plus(part.partition(b"=")[0].decode()) == field else part
        for part in body.split(b"&")
    ]
    return b"&".join(parts)
