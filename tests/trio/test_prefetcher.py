"""The prefetcher follows the plan: it reads the next load's files, and cancels the read
when the next load changes (router/prefetcher.py), on the mock clock."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from llamaswap.config.model import ModelConfig
from llamaswap.process.prefetch import PrefetchResult
from llamaswap.router.prefetcher import Prefetcher


class Reads:
    """A stand-in for ``prefetch``: each read waits until the test lets it end."""

    def __init__(self) -> None:
        self.started: list[tuple[str, ...]] = []
        self.cancelled: list[tuple[str, ...]] = []
        self.release = trio.Event()
        self.begun = trio.Event()

    async def __call__(self, files: tuple[str, ...]) -> PrefetchResult:
        self.started.append(files)
        self.begun.set()
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.cancelled.append(files)
            raise
        return PrefetchResult(1, 0.0, files, (), None, finished=True)


def models(directory: Path) -> dict[str, ModelConfig]:
    gguf = directory / "a.gguf"
    gguf.write_bytes(b"GGUF")
    return {
        "a": ModelConfig(cmd=("llama-server", "-m", str(gguf))),
        "b": ModelConfig(cmd=("x",), files=("/m/b-1.bin", "/m/b-2.bin")),
        "c": ModelConfig(cmd=("x",)),  # nothing to read
    }


async def test_the_next_load_is_read_and_a_change_of_plan_cancels_it(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    plan: list[str | None] = ["b"]
    reads = Reads()
    gguf = str(tmp_path / "a.gguf")
    prefetcher = Prefetcher(lambda: plan[0], models(tmp_path).__getitem__, reads)
    nursery.start_soon(prefetcher.run)
    prefetcher.poke()
    await reads.begun.wait()
    assert (reads.started, prefetcher.current) == ([("/m/b-1.bin", "/m/b-2.bin")], "b")
    reads.begun = trio.Event()
    plan[0] = "a"  # the plan changed: a loads next
    prefetcher.poke()
    await reads.begun.wait()
    assert reads.cancelled == [("/m/b-1.bin", "/m/b-2.bin")]
    assert reads.started[-1] == (gguf,)
    # A model with no files, or no load planned: the read in progress stops.
    plan[0] = "c"
    prefetcher.poke()
    await trio.testing.wait_all_tasks_blocked()
    await trio.sleep(1)  # past the throttle: the poke is looked at
    assert (reads.cancelled[-1], prefetcher.current) == ((gguf,), None)


async def test_a_finished_read_is_not_repeated_while_its_model_stays_next(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    reads = Reads()
    reads.release.set()
    prefetcher = Prefetcher(lambda: "b", models(tmp_path).__getitem__, reads)
    nursery.start_soon(prefetcher.run)
    for _ in range(3):
        prefetcher.poke()
        await trio.sleep(1)
    assert len(reads.started) == 1
