"""A model's output as lines (``process.spawn._pump_lines``): what ends a line, and how a
line too long for one piece is cut."""

from __future__ import annotations

from llamaswap.process.spawn import MAX_LINE_BYTES, _pump_lines


class Chunks:
    """A receive stream that gives ``chunks``, one per read, then its end."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""

    async def aclose(self) -> None:
        pass


async def lines_of(*chunks: bytes) -> list[str]:
    lines: list[str] = []
    await _pump_lines(Chunks(*chunks), lines.append)  # type: ignore[arg-type]
    return lines


async def test_lines_end_at_a_line_feed_whatever_the_reads() -> None:
    assert await lines_of(b"one\ntw", b"o\n\nthr", b"ee") == ["one", "two", "", "three"]
    assert await lines_of(b"crlf\r", b"\nnext\r\n") == ["crlf", "next"]


async def test_a_progress_bar_redrawn_in_place_gives_a_line_per_state() -> None:
    """``\\r`` alone ends a line: each state shows as it is drawn (it waited for the bar's
    final line feed, then came as one line holding every state and their ``\\r``s)."""
    bar = [b"loading\n", b"\r 10%", b"\r 50%", b"\r100%\n", b"ready\n"]
    assert await lines_of(*bar) == ["loading", " 10%", " 50%", "100%", "ready"]


async def test_a_long_line_is_cut_between_characters() -> None:
    """Each piece of a line over MAX_LINE_BYTES is the model's text: a cut inside a
    two-byte character made two replacement characters of it."""
    text = "a" + "é" * MAX_LINE_BYTES
    pieces = await lines_of(text.encode(), b"\n")  # the line feed after it, in another read
    assert len(pieces) == 3
    assert "".join(pieces) == text
    assert all(len(piece.encode()) <= MAX_LINE_BYTES for piece in pieces)
