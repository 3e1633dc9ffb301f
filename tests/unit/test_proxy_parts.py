"""The pure parts of the HTTP side: model extraction, rewriting, auth, names, errors."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamaswap.config import loads_config
from llamaswap.config.model import FilterConfig
from llamaswap.errors import (
    BadRequest,
    ConcurrencyLimit,
    MethodNotAllowed,
    ModelNotFound,
    ModelStartFailed,
    ModelUnloaded,
    RequestError,
    ShuttingDown,
    Unauthorized,
    UpstreamError,
)
from llamaswap.http.auth import authorized, presented_key
from llamaswap.http.client import UpstreamFailed, _origin
from llamaswap.http.errors import error_response
from llamaswap.proxy.extract import ModelIn, Payload, read_model, rewrite_body, rewrite_query
from llamaswap.router.names import Local, Names, Peer
from tests.fakes import FakeLoads
from tests.strategies import json_values
from tests.unit.ports import every_port_free

FORM = "multipart/form-data; boundary=xyz"
FORM_BODY = (
    b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
    b"Content-Type: audio/wav\r\n\r\nRIFF....\r\n"
    b'--xyz\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--xyz--\r\n'
)
FORM_WITHOUT_MODEL = (
    b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
    b"Content-Type: audio/wav\r\n\r\nRIFF....\r\n--xyz--\r\n"
)


def test_model_from_json_multipart_and_query() -> None:
    assert (
        read_model(ModelIn.JSON, Payload(b'{"model": "chat"}', "application/json"), b"") == "chat"
    )
    assert read_model(ModelIn.MULTIPART, Payload(FORM_BODY, FORM), b"") == "whisper"
    assert read_model(ModelIn.QUERY, Payload(b"", ""), b"x=1&model=org%2Fm") == "org/m"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"messages": []}', "names no model"),
        (b'{"model": 7}', "'model' must be a string \\(a model's name\\), got a number"),
        (b'{"model": ["a"]}', "'model' must be a string .*, got an array"),
        (b'{"model": null}', "names no model"),
        (b'{"model": ""}', "names no model"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_bad_json_bodies_are_400(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        read_model(ModelIn.JSON, Payload(body, "application/json"), b"")


@pytest.mark.parametrize(
    ("where", "fix"),
    [
        (ModelIn.JSON, "set the 'model' field"),
        (ModelIn.MULTIPART, "set the 'model' field"),
        (ModelIn.QUERY, "add \\?model=NAME to the URL"),
    ],
)
def test_a_request_naming_no_model_is_told_where_to_name_it(where: ModelIn, fix: str) -> None:
    empty = (
        Payload(b"{}", "application/json")
        if where is ModelIn.JSON
        else Payload(FORM_WITHOUT_MODEL, FORM)
    )
    with pytest.raises(
        BadRequest, match=f"^the request names no model: {fix}, or set defaultModel"
    ):
        read_model(where, empty, b"x=1")


def test_json_python_cannot_read_is_400() -> None:
    body = b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    payload = Payload(body, "application/json")
    with pytest.raises(BadRequest) as info:
        read_model(ModelIn.JSON, payload, b"")
    assert str(info.value) == "the request body nests arrays and objects too deeply to read"
    with pytest.raises(BadRequest):  # asked again (a filter, the stream flag): same answer
        payload.json()


def test_a_number_python_cannot_read_is_400_only_when_the_document_is_needed() -> None:
    """The model is read, and a filter applied, without building the document: the number
    goes through as written. Only a translation (``anthropic = "translate"``) needs the
    document."""
    digits = b"1" * 5000
    payload = Payload(b'{"model": "m", "seed": ' + digits + b"}", "application/json")
    assert read_model(ModelIn.JSON, payload, b"") == "m"
    rewritten = rewrite_body(ModelIn.JSON, payload, model="upstream-name")
    assert rewritten.raw == b'{"model":"upstream-name","seed":' + digits + b"}"
    with pytest.raises(BadRequest) as info:
        payload.json()
    assert str(info.value) == (
        "the request body holds a number with more than 4300 digits; llamaswap cannot read it"
    )


def test_a_rewrite_changes_top_level_keys_and_keeps_every_other_value_as_written() -> None:
    """Numbers a document would change (``1e400`` became ``Infinity``, which is not JSON;
    ``1E2`` became ``100.0``), text and nesting go upstream byte for byte, in order."""
    body = (
        b'{"model": "chat", "temperature": 1e400, "top_k": 1E2, "stop": ["\\u00e9", "\xc3\xa9"],'
        b' "seed": -0, "tools": [{"a": {"b": [1.50, null]}}], "drop": true}'
    )
    filters = FilterConfig(strip_params=("drop",), set_params={"top_k": 40, "n": 1.5})
    rewritten = rewrite_body(
        ModelIn.JSON, Payload(body, "application/json"), model="qwen:7b", filters=filters
    )
    assert rewritten.raw == (
        b'{"model":"qwen:7b","temperature":1e400,"top_k":40,"stop":["\\u00e9", "\xc3\xa9"],'
        b'"seed":-0,"tools":[{"a": {"b": [1.50, null]}}],"n":1.5}'
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "a", "x": [1, {"model": "inner"}], "model": "b", "stream": true}',
        b'{"model": "m", "temperature": NaN, "stream": false}',  # JSON's extensions
        '{"model": "m", "stream": true}'.encode("utf-16"),  # encodings json.loads detects
        b'{"model": "\\ud800", "stream": 1}',  # a lone surrogate
        b'{"stream": null}',
        b"{}",
    ],
)
def test_the_model_and_stream_fields_read_as_json_loads_reads_them(body: bytes) -> None:
    document = json.loads(body)
    payload = Payload(body, "application/json")
    assert payload.field("model") == document.get("model")
    assert payload.field("stream") == document.get("stream")
    assert payload.json() == document


def test_a_document_too_deep_to_write_back_is_400() -> None:
    nested: list[object] = []
    for _ in range(100_000):
        nested = [nested]
    payload = Payload(b"(parsed)", "application/json", {"model": "m", "x": nested})
    with pytest.raises(BadRequest, match="nests arrays and objects too deeply"):
        rewrite_body(ModelIn.JSON, payload, model="upstream-name")


def test_a_form_of_more_than_a_thousand_parts_is_400() -> None:
    def form(parts: int) -> bytes:
        fields = [
            f'--xyz\r\nContent-Disposition: form-data; name="f{i}"\r\n\r\nx\r\n'
            for i in range(parts - 1)
        ]
        model = '--xyz\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
        return ("".join(fields) + model + "--xyz--\r\n").encode()

    assert read_model(ModelIn.MULTIPART, Payload(form(1000), FORM), b"") == "whisper"
    with pytest.raises(BadRequest, match="the multipart form has more than 1000 parts"):
        read_model(ModelIn.MULTIPART, Payload(form(1001), FORM), b"")


def test_multipart_without_boundary_is_400() -> None:
    with pytest.raises(BadRequest, match="boundary"):
        read_model(ModelIn.MULTIPART, Payload(FORM_BODY, "multipart/form-data"), b"")


def test_unchanged_json_is_forwarded_byte_for_byte() -> None:
    payload = Payload(b'{"model":  "chat", "x": 1}', "application/json")
    assert rewrite_body(ModelIn.JSON, payload, model=None) is payload


def test_use_model_name_and_filters_rewrite_json() -> None:
    body = json.dumps({"model": "chat", "temperature": 2, "top_k": 5, "stream": True}).encode()
    filters = FilterConfig(
        strip_params=("temperature", "model"), set_params={"top_k": 40, "model": "no"}
    )
    payload = Payload(body, "application/json")
    rewritten = rewrite_body(ModelIn.JSON, payload, model="qwen:7b", filters=filters)
    assert json.loads(rewritten.raw) == {"model": "qwen:7b", "top_k": 40, "stream": True}
    assert rewritten.json() == json.loads(rewritten.raw)
    assert payload.json()["temperature"] == 2  # the client's document is left as it was


def test_use_model_name_rewrites_multipart_and_query() -> None:
    rewritten = rewrite_body(ModelIn.MULTIPART, Payload(FORM_BODY, FORM), model="whisper-large-v3")
    assert read_model(ModelIn.MULTIPART, rewritten, b"") == "whisper-large-v3"
    assert b"RIFF...." in rewritten.raw
    assert rewrite_query(b"model=a&voice=b", "c") == b"model=c&voice=b"


def test_api_keys_from_bearer_x_api_key_and_basic() -> None:
    basic = base64.b64encode(b"user:s3cret").decode()
    assert presented_key({"authorization": "Bearer s3cret"}) == "s3cret"
    assert presented_key({"x-api-key": "s3cret"}) == "s3cret"
    assert presented_key({"authorization": f"Basic {basic}"}) == "s3cret"
    assert presented_key({"authorization": "Basic !!!"}) is None
    assert presented_key({}) is None
    assert authorized([], {})
    assert authorized(["a", "s3cret"], {"authorization": "Bearer s3cret"})
    assert not authorized(["a"], {"authorization": "Bearer s3cret"})
    assert not authorized(["a"], {})


def test_names_resolve_ids_aliases_and_peers() -> None:
    config = loads_config(
        """
        [models."org/chat"]
        cmd = "server --port ${PORT}"
        aliases = ["gpt-4o-mini"]
        [models.embed]
        cmd = "server --port ${PORT}"
        [peers.gpu2]
        proxy = "http://10.0.0.2:8080"
        models = ["coder", "embed", "shared"]
        [peers.gpu3]
        proxy = "http://10.0.0.3:8080"
        models = ["shared"]
        """,
        free=every_port_free,
    )
    names = Names(config, FakeLoads())
    assert names.resolve("org/chat") == Local("org/chat")
    assert names.resolve("gpt-4o-mini") == Local("org/chat")
    assert names.resolve("embed") == Local("embed")  # local wins over a peer's bare name
    coder = names.resolve("coder")
    assert isinstance(coder, Peer)
    assert (coder.peer_id, coder.model) == ("gpu2", "coder")
    assert names.resolve("gpu2/embed") == Peer("gpu2", "embed", config.peers["gpu2"])
    with pytest.raises(ModelNotFound):
        names.resolve("shared")  # two peers have it: ambiguous without a prefix
    assert isinstance(names.resolve("gpu3/shared"), Peer)
    assert names.peer_models() == ["gpu2/coder", "gpu2/embed", "gpu2/shared", "gpu3/shared"]

    # /upstream/{model}/{path}: the longest name wins.
    assert names.resolve_path("org", "chat/v1/models") == (Local("org/chat"), "/v1/models")
    assert names.resolve_path("gpu2", "coder/") == (coder, "/")
    assert names.resolve_path("embed", "") == (Local("embed"), "/")
    with pytest.raises(ModelNotFound, match="'org'"):
        names.resolve_path("org", "chats/x")
    # A path of many segments is tried only as far as a name can reach (two segments here).
    tried: list[str] = []

    def upstream(name: str) -> Local | Peer:
        tried.append(name)
        raise ModelNotFound(name)

    names.upstream = upstream  # type: ignore[method-assign]
    with pytest.raises(ModelNotFound):
        names.resolve_path("a", "b/" * 30_000)
    assert tried == ["a/b", "a"]


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (BadRequest("no model", param="model"), 400, "invalid_request"),
        (Unauthorized(), 401, "invalid_api_key"),
        (ModelNotFound("x"), 404, "model_not_found"),
        (MethodNotAllowed("GET", "/v1/x", "POST"), 405, "method_not_allowed"),
        (ConcurrencyLimit("x", 2), 429, "concurrency_limit"),
        (ModelStartFailed("x", "exited", log_tail=["boom"]), 502, "model_start_failed"),
        (UpstreamError("x", "refused"), 502, "upstream_error"),
        (ModelUnloaded("x"), 503, "model_unloaded"),
        (ShuttingDown(), 503, "shutting_down"),
    ],
)
def test_error_table(error: RequestError, status: int, code: str) -> None:
    got_status, headers, body = error_response(error)
    document = json.loads(body)
    assert got_status == status
    assert document["error"]["code"] == code
    assert document["error"]["message"] == str(error)
    assert set(document["error"]) == {"message", "type", "code", "param"}
    assert ("content-type", "application/json") in headers
    if status == 429:
        assert ("retry-after", "1") in headers
    if status == 401:
        assert ("www-authenticate", 'Basic realm="llamaswap"') in headers
    if status == 405:
        assert ("allow", "POST") in headers


def test_errors_name_the_config_key_as_the_config_spells_it() -> None:
    assert '(models."a b".concurrencyLimit)' in str(ConcurrencyLimit("a b", 2))
    assert str(ModelStartFailed("qwen2.5", "exited")).endswith('check models."qwen2.5".cmd')


def test_a_start_failure_quotes_at_most_300_characters_of_each_output_line() -> None:
    failure = ModelStartFailed("m", "exited", log_tail=["x" * 16384, "last words"])
    assert f"(last output: {'x' * 300}… | last words)" in str(failure)
    assert failure.log_tail[0] == "x" * 16384  # kept whole for whoever reads the log


def test_a_name_not_found_is_quoted_to_at_most_200_characters() -> None:
    # A request body (up to maxBodyBytes) may name anything; the message is logged and kept.
    name = "n" * 1_000_000
    error = ModelNotFound(name)
    assert str(error) == (
        f"model '{'n' * 200}…' (1000000 characters) not found; GET /v1/models lists the models"
    )
    assert error.model == name
    assert str(ModelNotFound("n" * 200)) == (
        f"model '{'n' * 200}' not found; GET /v1/models lists the models"
    )


@pytest.mark.parametrize(
    ("base", "where", "host_header", "prefix"),
    [
        ("http://127.0.0.1:8080", ("http", "127.0.0.1", 8080), b"127.0.0.1:8080", ""),
        ("http://localhost/", ("http", "localhost", 80), b"localhost", ""),
        ("https://x.org/v1/", ("https", "x.org", 443), b"x.org", "/v1"),
        ("https://h:8443/a/b", ("https", "h", 8443), b"h:8443", "/a/b"),
        ("http://[::1]:9000", ("http", "::1", 9000), b"[::1]:9000", ""),
    ],
)
def test_an_upstream_base_url_gives_the_address_host_header_and_prefix(
    base: str, where: tuple[str, str, int], host_header: bytes, prefix: str
) -> None:
    origin = _origin(base)
    assert (origin.scheme, origin.host, origin.port) == where
    assert (origin.host_header, origin.prefix) == (host_header, prefix)


@pytest.mark.parametrize("base", ["ftp://host/", "http://", "127.0.0.1:8080"])
def test_an_upstream_base_url_that_is_not_http_is_refused(base: str) -> None:
    with pytest.raises(UpstreamFailed, match="not an http"):
        _origin(base)


def test_an_error_class_answers_like_its_nearest_ancestor_in_the_table() -> None:
    class Evicted(ModelUnloaded):
        pass

    class Unmapped(RequestError):
        pass

    assert error_response(Evicted("m"))[0] == 503
    status, _, body = error_response(Unmapped("oops"))
    assert (status, json.loads(body)["error"]["code"]) == (500, "internal_error")


def test_set_params_by_id_applies_for_the_name_requested_after_set_params() -> None:
    filters = FilterConfig(
        set_params={"temperature": 0.7, "top_p": 0.9},
        set_params_by_id={"chat:hot": {"temperature": 1.5, "model": "no"}},
    )
    payload = Payload(b'{"model": "chat:hot", "temperature": 0.1}', "application/json")
    hot = rewrite_body(ModelIn.JSON, payload, model=None, filters=filters, requested="chat:hot")
    assert hot.json() == {"model": "chat:hot", "temperature": 1.5, "top_p": 0.9}
    plain = rewrite_body(ModelIn.JSON, payload, model=None, filters=filters, requested="chat")
    assert plain.json() == {"model": "chat:hot", "temperature": 0.7, "top_p": 0.9}


@given(
    st.dictionaries(
        st.sampled_from(["model", "stream", "messages"]) | st.text(),
        json_values("model", "stream"),
    )
)
def test_any_json_object_gives_the_fields_json_loads_gives(document: dict[str, object]) -> None:
    body = json.dumps(document).encode()  # NaN and Infinity included, as clients may send
    payload = Payload(body, "application/json")
    expected = json.loads(body)
    assert repr(payload.field("model")) == repr(expected.get("model"))
    assert repr(payload.field("stream")) == repr(expected.get("stream"))
