"""The upstream client's chunked-body decoder, checked against h11's on the same bytes."""

from __future__ import annotations

import random

import h11
import pytest

from llamaswap.http.client import _MAX_LINE, _Chunked

HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def via_h11(body: bytes) -> bytes:
    """The data h11 decodes from a chunked ``body``; raises h11.RemoteProtocolError."""
    connection = h11.Connection(h11.CLIENT)
    connection.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    connection.send(h11.EndOfMessage())
    connection.receive_data(HEAD + body)
    data = b""
    while True:
        event = connection.next_event()
        if isinstance(event, h11.Data):
            data += event.data
        elif isinstance(event, h11.EndOfMessage):
            return data
        elif isinstance(event, h11.Response):
            continue
        else:
            raise AssertionError(f"h11 did not reach the end: {event!r}")


def via_ours(pieces: list[bytes]) -> tuple[bytes, _Chunked]:
    decoder = _Chunked()
    data = b""
    for piece in pieces:
        if decoder.done:  # the body ended: nothing of it comes after
            assert piece == b""
            continue
        data += decoder.feed(piece)
    return data, decoder


def split(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut at random places, some pieces empty, some a single byte."""
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(8)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def encode(chunks: list[bytes], rng: random.Random) -> bytes:
    out = []
    for chunk in chunks:
        size = f"{len(chunk):x}"
        size = size.upper() if rng.random() < 0.3 else size
        extension = rng.choice([b"", b"", b"", b";name=value", b';a="b;c"', b"  "])
        out.append(size.encode() + extension + b"\r\n" + chunk + b"\r\n")
    trailer = rng.choice([b"", b"checksum: abc\r\n", b"a: 1\r\nb: 2\r\n"])
    return b"".join(out) + b"0\r\n" + trailer + b"\r\n"


def test_what_h11_decodes_is_decoded_alike_however_the_bytes_arrive() -> None:
    rng = random.Random(13)
    for _ in range(500):
        chunks = [rng.randbytes(rng.choice([1, 2, 7, 100, 5000])) for _ in range(rng.randrange(6))]
        body = encode(chunks, rng)
        data, decoder = via_ours(split(body, rng))
        assert data == via_h11(body) == b"".join(chunks)
        assert decoder.done
        assert decoder.leftover == b""


def test_data_is_passed_on_before_its_chunk_is_complete() -> None:
    decoder = _Chunked()
    assert decoder.feed(b"a\r\n01234") == b"01234"
    assert decoder.feed(b"56789\r") == b"56789"
    assert not decoder.done
    assert decoder.feed(b"\n0\r\n\r\n") == b""
    assert decoder.done


@pytest.mark.parametrize("after", [b"HTTP/1.1 200 OK\r\n", b"5\r\nabcde\r\n"])
def test_bytes_after_the_body_are_kept_as_leftover(after: bytes) -> None:
    data, decoder = via_ours([b"3\r\nabc\r\n0\r\n\r\n" + after])
    assert data == b"abc"
    assert decoder.done
    assert decoder.leftover == after


@pytest.mark.parametrize(
    "body",
    [
        b"0x3\r\nabc\r\n0\r\n\r\n",  # Python's int() would take these sizes
        b"+3\r\nabc\r\n0\r\n\r\n",
        b" 3\r\nabc\r\n0\r\n\r\n",
        b"1_0\r\n0123456789abcdef\r\n0\r\n\r\n",
        b"g\r\n",
        b"\r\n",
        b"3\r\nabcX\r\n0\r\n\r\n",  # no CRLF after the data
        b"3\r\nabc\n\n0\r\n\r\n",
        b"1" * 21 + b"\r\n",  # more hex digits than h11 takes
    ],
)
def test_what_h11_refuses_is_refused(body: bytes) -> None:
    with pytest.raises(h11.RemoteProtocolError):
        via_h11(body)
    with pytest.raises(h11.RemoteProtocolError):
        via_ours([body])


def test_a_line_that_never_ends_is_refused_once_past_the_limit() -> None:
    decoder = _Chunked()
    assert decoder.feed(b"1" * _MAX_LINE) == b""  # not yet: the line may still end
    with pytest.raises(h11.RemoteProtocolError, match="too long"):
        decoder.feed(b"1")
