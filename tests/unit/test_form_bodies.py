"""Forms naming the model: a body's Content-Type decides how it is read, on every body
route; URL-encoded forms are read and rewritten like multipart ones, as pure code."""

from __future__ import annotations

import pytest

from llamaswap.errors import BadRequest
from llamaswap.proxy.extract import ModelIn, Payload, body_kind, read_model, rewrite_body
from tests.unit.test_proxy_parts import FORM, FORM_BODY

URLENCODED = "application/x-www-form-urlencoded"
JSON, MULTIPART, FORM_KIND, QUERY = ModelIn.JSON, ModelIn.MULTIPART, ModelIn.FORM, ModelIn.QUERY


@pytest.mark.parametrize(
    ("where", "content_type", "kind"),
    [
        (JSON, "application/json", JSON),
        (JSON, "Application/JSON; charset=utf-8", JSON),
        (JSON, "application/vnd.api+json", JSON),
        (JSON, "", JSON),  # says nothing: as the route expects
        (JSON, "text/plain", JSON),
        (JSON, FORM, MULTIPART),  # /sdapi/v1/img2img posted as a form
        (JSON, f"{URLENCODED}; charset=utf-8", FORM_KIND),
        (MULTIPART, "", MULTIPART),
        (MULTIPART, URLENCODED, FORM_KIND),
        (MULTIPART, "application/json", JSON),
        (QUERY, URLENCODED, QUERY),  # GET /props?model=...: the query, whatever the body
    ],
)
def test_the_content_type_says_how_a_body_names_its_model(
    where: ModelIn, content_type: str, kind: ModelIn
) -> None:
    assert body_kind(where, content_type) is kind


def test_a_urlencoded_form_names_the_model_by_its_first_model_field() -> None:
    body = b"prompt=a+cat%21&model=sd%2Fxl+turbo&model=other&empty="
    assert read_model(FORM_KIND, Payload(body, URLENCODED), b"") == "sd/xl turbo"
    assert read_model(FORM_KIND, Payload(b"prompt=x", URLENCODED), b"", default="d") == "d"
    assert read_model(FORM_KIND, Payload(b"model=", URLENCODED), b"", default="d") == "d"
    with pytest.raises(BadRequest, match="names no model: set the 'model' field"):
        read_model(FORM_KIND, Payload(b"", URLENCODED), b"")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"model=caf\xe9", r"the form is not UTF-8 \(unexpected end of data at byte 9\)"),
        (b"model=caf%E9", "the form is not UTF-8 once its %XX escapes are decoded"),
        (b"a=1&" * 1000 + b"model=m", "the form has more than 1000 fields"),
    ],
)
def test_a_malformed_urlencoded_form_is_400(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        read_model(FORM_KIND, Payload(body, URLENCODED), b"")


def test_a_thousand_fields_are_read() -> None:
    body = b"a=1&" * 999 + b"model=m"
    assert read_model(FORM_KIND, Payload(body, URLENCODED), b"") == "m"


def test_rewriting_a_urlencoded_model_keeps_every_other_byte() -> None:
    body = b"prompt=a+cat%21&model=sd&steps=4&MODEL=x&model=again"
    rewritten = rewrite_body(FORM_KIND, Payload(body, URLENCODED), model="sd xl/turbo")
    assert (
        rewritten.raw == b"prompt=a+cat%21&model=sd+xl%2Fturbo&steps=4&MODEL=x&model=sd+xl%2Fturbo"
    )
    assert rewritten.content_type == URLENCODED
    assert read_model(FORM_KIND, rewritten, b"") == "sd xl/turbo"
    unchanged = Payload(body, URLENCODED)
    assert rewrite_body(FORM_KIND, unchanged, model=None) is unchanged


def test_a_multipart_form_to_a_json_route_is_read_and_rewritten_as_a_form() -> None:
    kind = body_kind(JSON, FORM)
    assert read_model(kind, Payload(FORM_BODY, FORM), b"") == "whisper"
    rewritten = rewrite_body(kind, Payload(FORM_BODY, FORM), model="sd")
    assert read_model(kind, rewritten, b"") == "sd"
    assert b"RIFF...." in rewritten.raw
