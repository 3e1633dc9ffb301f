"""The page-cache prefetch (llamaswap/process/prefetch.py): which files, how much, and
that a cancellation stops it after the chunk in flight. Real files in ``tmp_path``, real
worker threads; the memory probe is a fake the tests control."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from llamaswap.config.model import ModelConfig
from llamaswap.process.prefetch import (
    PrefetchProgress,
    Skipped,
    drop_cache,
    mem_available,
    prefetch,
    weight_files,
)

CHUNK = 64 * 1024
MARGIN = 1000


def model(
    *cmd: str, files: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> ModelConfig:
    return ModelConfig(cmd=("llama-server", *cmd), proxy="http://m:9", files=files, env=env or {})


def write(path: Path, size: int) -> str:
    path.write_bytes(os.urandom(size))
    return str(path)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Memory:
    """A fake ``MemAvailable`` probe: the figures given, one per call, the last repeated.

    It runs in prefetch's worker thread (the first call before any file, call n + 1 right
    after chunk n's read), so it can also act while a chunk's thread call is in flight:
    at call ``cancel_at`` it cancels ``scope``; at call ``pause_at`` it sets ``reached``
    and holds the thread until ``release`` is set."""

    def __init__(self, *figures: int | None, cancel_at: int = 0, pause_at: int = 0) -> None:
        self.figures = list(figures)
        self.calls = 0
        self.cancel_at = cancel_at
        self.scope: trio.CancelScope | None = None
        self.pause_at = pause_at
        self.reached = trio.Event()
        self.release = threading.Event()

    def __call__(self) -> int | None:
        self.calls += 1
        if self.calls == self.cancel_at and self.scope is not None:
            trio.from_thread.run_sync(self.scope.cancel)
        if self.calls == self.pause_at:
            trio.from_thread.run_sync(self.reached.set)
            assert self.release.wait(timeout=10)
        return self.figures[min(self.calls, len(self.figures)) - 1]


def no_meminfo() -> int | None:
    return None


# --- weight_files -------------------------------------------------------------------


def test_files_key_wins_as_given(tmp_path: Path) -> None:
    gguf = write(tmp_path / "m.gguf", 10)
    assert weight_files(model("-m", gguf, files=("a.gguf", "b.gguf"))) == ("a.gguf", "b.gguf")


@pytest.mark.parametrize("option", ["-m", "--model"])
def test_the_model_option(tmp_path: Path, option: str) -> None:
    gguf = write(tmp_path / "m.gguf", 10)
    assert weight_files(model("--port", "9", option, gguf, "-c", "8192")) == (gguf,)


def test_the_last_model_option_wins_as_in_llama_server(tmp_path: Path) -> None:
    first, last = write(tmp_path / "a.gguf", 10), write(tmp_path / "b.gguf", 10)
    assert weight_files(model("-m", first, "--model", last)) == (last,)


@pytest.mark.parametrize("form", ["--model={}", "-m={}", "-m{}"])
def test_forms_llama_server_rejects_name_nothing(tmp_path: Path, form: str) -> None:
    gguf = write(tmp_path / "m.gguf", 10)
    assert weight_files(model(form.format(gguf))) == ()


def test_a_missing_file_or_no_option_is_nothing(tmp_path: Path) -> None:
    assert weight_files(model("-m", str(tmp_path / "absent.gguf"))) == ()
    assert weight_files(model("-hf", "org/repo")) == ()
    assert weight_files(model("-m")) == ()
    assert weight_files(model("-m", str(tmp_path))) == ()  # a folder


def test_the_environment_variable_when_no_option(tmp_path: Path) -> None:
    env, option = write(tmp_path / "env.gguf", 10), write(tmp_path / "cmd.gguf", 10)
    assert weight_files(model(env={"LLAMA_ARG_MODEL": env})) == (env,)
    assert weight_files(model("-m", option, env={"LLAMA_ARG_MODEL": env})) == (option,)


def test_a_split_model_brings_its_other_parts(tmp_path: Path) -> None:
    parts = [write(tmp_path / f"big-{i:05d}-of-00003.gguf", 10) for i in (1, 2, 3)]
    assert weight_files(model("-m", parts[0])) == tuple(parts)
    # Given a later part, llama.cpp would fail; nothing is guessed.
    assert weight_files(model("-m", parts[1])) == (parts[1],)
    os.remove(parts[2])
    assert weight_files(model("-m", parts[0])) == tuple(parts[:2])


# --- mem_available -------------------------------------------------------------------


def test_mem_available_reads_kilobytes(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  2048 kB\nMemFree:  100 kB\nMemAvailable:  1500 kB\n")
    assert mem_available(str(meminfo)) == 1500 * 1024
    meminfo.write_text("MemTotal:  2048 kB\n")
    assert mem_available(str(meminfo)) is None
    assert mem_available(str(tmp_path / "absent")) is None


def test_mem_available_on_this_machine() -> None:
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo")
    figure = mem_available()
    assert figure is not None
    assert figure > 0


# --- prefetch ------------------------------------------------------------------------


async def test_reads_every_file(tmp_path: Path) -> None:
    sizes = [3 * CHUNK + 5, CHUNK, 0]
    paths = [write(tmp_path / f"{i}.gguf", size) for i, size in enumerate(sizes)]
    result = await prefetch(paths, chunk=CHUNK, available=no_meminfo)
    assert result.bytes_read == sum(sizes)
    assert result.read == tuple(paths)
    assert result.skipped == ()
    assert result.budget is None
    assert result.finished
    assert result.seconds >= 0


async def test_the_budget_stops_inside_a_file_and_skips_the_rest(tmp_path: Path) -> None:
    first = write(tmp_path / "a.gguf", 4 * CHUNK)
    second = write(tmp_path / "b.gguf", 4 * CHUNK)
    third = write(tmp_path / "c.gguf", 10)
    budget = 5 * CHUNK + 123
    result = await prefetch([first, second, third], budget=budget, chunk=CHUNK)
    assert result.bytes_read == budget
    assert result.read == (first,)
    assert [(s.path, s.reason, s.bytes_read) for s in result.skipped] == [
        (second, "over budget", CHUNK + 123),
        (third, "over budget", 0),
    ]
    assert result.skipped[0].detail == f"budget of {budget} bytes"


async def test_free_memory_less_the_margin_bounds_it(tmp_path: Path) -> None:
    path = write(tmp_path / "a.gguf", 8 * CHUNK)
    memory = Memory(MARGIN + 3 * CHUNK)
    result = await prefetch([path], margin=MARGIN, chunk=CHUNK, available=memory)
    assert result.budget == 3 * CHUNK
    assert result.bytes_read == 3 * CHUNK
    assert result.skipped == (
        Skipped(
            path,
            "over budget",
            f"{MARGIN + 3 * CHUNK} bytes of memory available, {MARGIN} kept free",
            3 * CHUNK,
        ),
    )


async def test_memory_taken_meanwhile_shrinks_the_room(tmp_path: Path) -> None:
    # The cache being filled stays in MemAvailable; what another process allocates does
    # not. 6 chunks of room at first; after the first chunk someone takes 3 of them.
    path = write(tmp_path / "a.gguf", 8 * CHUNK)
    memory = Memory(MARGIN + 6 * CHUNK, MARGIN + 3 * CHUNK)
    result = await prefetch([path], margin=MARGIN, chunk=CHUNK, available=memory)
    assert result.bytes_read == 3 * CHUNK


async def test_no_room_at_all_reads_nothing(tmp_path: Path) -> None:
    path = write(tmp_path / "a.gguf", CHUNK)
    result = await prefetch([path], margin=MARGIN, chunk=CHUNK, available=Memory(MARGIN // 2))
    assert result.bytes_read == 0
    assert result.budget == 0
    assert [s.reason for s in result.skipped] == ["over budget"]


async def test_unusable_files_are_skipped_and_the_others_read(tmp_path: Path) -> None:
    good = write(tmp_path / "good.gguf", CHUNK + 1)
    missing = str(tmp_path / "missing.gguf")
    folder = str(tmp_path)
    link = tmp_path / "again.gguf"
    link.symlink_to(good)
    result = await prefetch([missing, good, folder, str(link)], chunk=CHUNK)
    assert result.bytes_read == CHUNK + 1
    assert result.read == (good,)
    assert [(s.path, s.reason) for s in result.skipped] == [
        (missing, "missing"),
        (folder, "not a file"),
        (str(link), "duplicate"),
    ]


async def test_chunk_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="chunk must be positive"):
        await prefetch([], chunk=0)


async def test_a_cancel_stops_it_after_the_chunk_in_flight(tmp_path: Path) -> None:
    # The probe runs in the worker thread right after each chunk's read: cancelling from
    # there is a cancellation arriving while that chunk's thread call is in flight.
    path = write(tmp_path / "a.gguf", 16 * CHUNK)
    memory = Memory(None, cancel_at=3)  # after the second chunk
    progress = PrefetchProgress()
    fds = open_fds()
    with trio.CancelScope() as scope:
        memory.scope = scope
        await prefetch([path], chunk=CHUNK, available=memory, progress=progress)
    assert scope.cancelled_caught
    assert progress.bytes_read == 2 * CHUNK  # the chunk in flight counts; no third one
    assert memory.calls == 3
    assert progress.current == path
    assert progress.read == []
    assert not progress.statistics().finished
    assert open_fds() == fds  # the descriptor was closed


async def test_a_cancel_from_another_task_waits_for_the_chunk_in_flight(tmp_path: Path) -> None:
    path = write(tmp_path / "a.gguf", 16 * CHUNK)
    memory = Memory(None, pause_at=4)  # held in the thread call of the third chunk
    progress = PrefetchProgress()
    fds = open_fds()
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await prefetch([path], chunk=CHUNK, available=memory, progress=progress)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await memory.reached.wait()
        assert progress.bytes_read == 2 * CHUNK  # the third is read, not yet counted
        try:
            scope.cancel(reason="the plan changed")
            await trio.testing.wait_all_tasks_blocked()
            assert progress.bytes_read == 2 * CHUNK  # the cancel waits for the thread call
        finally:
            memory.release.set()
    assert scope.cancelled_caught
    assert progress.bytes_read == 3 * CHUNK  # that chunk counts; no fourth one started
    assert memory.calls == 4
    assert open_fds() == fds


async def test_cancelled_before_it_starts_reads_nothing(tmp_path: Path) -> None:
    path = write(tmp_path / "a.gguf", CHUNK)
    progress = PrefetchProgress()
    with trio.CancelScope() as scope:
        scope.cancel()
        await prefetch([path], chunk=CHUNK, progress=progress)
    assert scope.cancelled_caught
    assert progress.bytes_read == 0


# --- drop_cache ----------------------------------------------------------------------


def test_drop_cache(tmp_path: Path) -> None:
    path = write(tmp_path / "a.gguf", CHUNK)
    drop_cache(path)  # a fresh file's dirty pages are written first, then dropped
    assert Path(path).read_bytes() != b""
    with pytest.raises(FileNotFoundError):
        drop_cache(str(tmp_path / "absent"))
