"""Read the next model's weight files into the page cache while the current one serves.

The problem. A swap's load time is mostly the time to read the weights: llama-server
reads (or maps and faults in) the whole GGUF file before ``/health`` answers. When the
queue already says which model loads next, that reading can happen earlier, while the
GPU still serves the current model, so that the load itself reads from memory.

What the kernel offers, measured (Linux 6.18, ext4 on virtio, a 1 GiB file):

* ``posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED)`` returns in a few milliseconds and
  puts at most one readahead window into the cache (0 to 8 MiB, ``read_ahead_kb`` being
  8192 there), and nothing more arrives later. The kernel caps each WILLNEED (and
  ``readahead(2)``, the same code) at the device's readahead size: calls on 16 MiB ranges
  cached 512 of 1024 MiB, on 64 MiB ranges 128 MiB. Calls on ranges no larger than the
  window do cache everything, but that size differs per device (128 KiB is a common
  default), and the I/O completes asynchronously, with no sign of when.
* Plain sequential ``preadv`` in 16 MiB chunks (with ``POSIX_FADV_SEQUENTIAL``, which
  widens the kernel's own readahead) reads at the device's speed and, when a chunk call
  returns, that chunk *is* in the cache.

The design. ``prefetch`` reads each file in chunks, one ``trio.to_thread.run_sync`` call
per chunk, into one reused buffer (the copy to user space costs a few milliseconds per
16 MiB, far less than the reading). Before each chunk it bounds what it reads by free
memory (``MemAvailable`` less a margin): reading more than fits would only evict the
file's own first pages, or other files' cached pages, and press on processes' memory.
Cancellation (the plan changed) is honoured between chunks.

Rejected: ``abandon_on_cancel=True`` on the chunk calls. It would return at once on
cancel, but the abandoned thread would go on reading into the shared buffer from a
descriptor that the ``finally`` closes, and that the process may by then have reused for
something else. One chunk's wait (a few ms on NVMe, ~0.1 s on a disk) is the price of
never having a stray reader. ``mmap`` with ``MADV_POPULATE_READ`` would skip the copy,
but Python's ``mmap`` module does not expose it.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from typing import Literal, final

import attrs
import trio

from llamaswap.config.model import ModelConfig

__all__ = [
    "CHUNK",
    "DEFAULT_MARGIN",
    "PrefetchProgress",
    "PrefetchResult",
    "SkipReason",
    "Skipped",
    "drop_cache",
    "mem_available",
    "prefetch",
    "weight_files",
]

MiB = 2**20
#: Bytes read per thread call: what a cancellation may have to wait for.
CHUNK = 16 * MiB
#: Bytes of ``MemAvailable`` a prefetch leaves alone: room for the current model's own
#: growth and for what the next one allocates beside its weights.
DEFAULT_MARGIN = 1024 * MiB

#: llama-server's options for the main model file (common/arg.cpp). It accepts neither
#: ``--model=PATH`` nor ``-m=PATH`` ("invalid argument"), and the last one given wins.
_MODEL_OPTIONS = frozenset({"-m", "--model"})
#: The environment variable llama-server reads when no ``-m`` is given.
_MODEL_ENV = "LLAMA_ARG_MODEL"
#: A split GGUF model's first file: llama.cpp opens the others itself (llama_split_path).
_SPLIT = re.compile(r"(?P<prefix>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf")


def weight_files(model: ModelConfig) -> tuple[str, ...]:
    """The files a load of ``model`` reads, as far as its config says.

    ``model.files`` when set, as given. Otherwise the model file of a llama-server
    command line: the value after the last ``-m`` or ``--model`` in ``model.cmd`` (or,
    without one, ``LLAMA_ARG_MODEL`` in ``model.env``), if that file exists; for the first
    file of a split model (``name-00001-of-00003.gguf``) also the other parts that exist.
    Relative paths are relative to llamaswap's working folder, which the model's process
    inherits. Empty when nothing is found (another server, a wrapper such as ``docker``
    whose path lives elsewhere, a model downloaded with ``-hf``).

    Touches the file system only to check that the files exist.
    """
    if model.files:
        return model.files
    path = None
    for option, value in zip(model.cmd, model.cmd[1:], strict=False):
        if option in _MODEL_OPTIONS:
            path = value
    if path is None:
        path = model.env.get(_MODEL_ENV)
    if not path or not os.path.isfile(path):
        return ()
    split = _SPLIT.fullmatch(path)
    if split is None or int(split["index"]) != 1:
        return (path,)
    prefix, count = split["prefix"], split["count"]
    parts = [f"{prefix}-{index:05d}-of-{count}.gguf" for index in range(1, int(count) + 1)]
    return tuple(part for part in parts if os.path.isfile(part))


SkipReason = Literal["missing", "not a file", "unreadable", "duplicate", "over budget"]


@attrs.frozen
class Skipped:
    """A file not read, or not read to its end (``bytes_read`` says how far)."""

    path: str
    reason: SkipReason
    detail: str = ""
    bytes_read: int = 0


@attrs.frozen
class PrefetchResult:
    """What a prefetch did: the files read in full, those not, and the time it took."""

    bytes_read: int
    seconds: float
    read: tuple[str, ...]
    skipped: tuple[Skipped, ...]
    #: The most the prefetch allowed itself when it began: ``budget`` or free memory less
    #: the margin, whichever was less; None: no bound known (no ``/proc/meminfo``).
    budget: int | None
    #: False while running, and after a cancellation.
    finished: bool


@final
@attrs.define(eq=False)
class PrefetchProgress:
    """A prefetch's running account, which the caller may pass in to read while it runs
    or after it was cancelled (``prefetch`` itself returns nothing then)."""

    bytes_read: int = 0
    read: list[str] = attrs.field(factory=list)
    skipped: list[Skipped] = attrs.field(factory=list)
    #: The file being read now.
    current: str | None = None
    budget: int | None = None
    started: float | None = None
    ended: float | None = None

    def statistics(self) -> PrefetchResult:
        """A snapshot; ``seconds`` counts up to now while it runs."""
        if self.started is None:
            seconds = 0.0
        else:
            end = trio.current_time() if self.ended is None else self.ended
            seconds = end - self.started
        return PrefetchResult(
            bytes_read=self.bytes_read,
            seconds=seconds,
            read=tuple(self.read),
            skipped=tuple(self.skipped),
            budget=self.budget,
            finished=self.ended is not None,
        )


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    """``MemAvailable`` in bytes, or None where the file or the line is missing.

    The kernel counts clean page cache as available, so reading a file into the cache
    hardly lowers this figure: what falls is what processes allocate for themselves.
    """
    try:
        with open(meminfo, "rb") as lines:
            for line in lines:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


async def prefetch(
    paths: Iterable[str],
    *,
    budget: int | None = None,
    margin: int = DEFAULT_MARGIN,
    chunk: int = CHUNK,
    available: Callable[[], int | None] = mem_available,
    progress: PrefetchProgress | None = None,
) -> PrefetchResult:
    """Read ``paths`` into the page cache, in order, within ``budget`` bytes and free memory.

    The bound, checked before every chunk: at most ``budget`` bytes in all (None: no
    cap), and at most ``available() - margin`` (``MemAvailable`` from ``/proc/meminfo``
    less ``margin``, re-read after every chunk). Since the cache being filled stays in
    ``MemAvailable``, the bytes already read are subtracted from it as well: what shrinks
    the room is memory that processes allocate meanwhile. The file at which the room runs
    out is read as far as it fits (a loader reads sequentially, so a cached beginning
    still saves its share) and it and the files after it are reported ``over budget``.
    Files already (partly) cached count in full: there is no cheap way to ask which pages
    are resident.

    A missing, non-regular or unreadable file (an ``OSError`` while opening or reading)
    is reported and skipped; the others are still read. The same file twice (by device
    and inode) is read once.

    Args:
        paths: The files, in the order the loader reads them (``weight_files``).
        budget: A cap in bytes, None for none.
        margin: Bytes of ``MemAvailable`` to leave alone.
        chunk: Bytes read per thread call.
        available: The free-memory probe (a test can pass its own).
        progress: Filled in as the prefetch goes, if given.

    Returns:
        The final ``progress.statistics()``.

    Cancellation:
        Every await is a ``trio.to_thread.run_sync`` call without ``abandon_on_cancel``:
        opening a file (and its ``fstat``), or reading one chunk. A cancellation arriving
        during such a call waits for that call to return (one chunk's read at most), and
        is raised at the next one's start, before any new reading: nothing is read after
        the chunk in flight, the open descriptor is closed, and ``progress`` holds what
        was read (including that chunk). If that chunk was the last, ``prefetch``
        returns its result, and the cancellation is raised at the caller's next
        checkpoint. No thread outlives the call.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk!r}")
    progress = PrefetchProgress() if progress is None else progress
    progress.started = trio.current_time()
    cap = math.inf if budget is None else budget
    buffer = memoryview(bytearray(chunk))
    seen: set[tuple[int, int]] = set()
    pending = list(paths)
    free = await trio.to_thread.run_sync(available)
    if budget is not None or free is not None:
        progress.budget = max(0, _room(cap, free, margin, 0))
    for index, path in enumerate(pending):
        if _room(cap, free, margin, progress.bytes_read) <= 0:
            rest = pending[index:]
            progress.skipped.extend(_over(later, cap, free, margin) for later in rest)
            break
        progress.current = path
        try:
            fd, size, identity = await trio.to_thread.run_sync(_open, path)
        except FileNotFoundError as exc:
            progress.skipped.append(Skipped(path, "missing", exc.strerror or ""))
            continue
        except _NotAFile as exc:
            progress.skipped.append(Skipped(path, "not a file", str(exc)))
            continue
        except OSError as exc:
            progress.skipped.append(Skipped(path, "unreadable", str(exc)))
            continue
        offset = 0
        try:
            if identity in seen:
                progress.skipped.append(Skipped(path, "duplicate"))
                continue
            seen.add(identity)
            while offset < size:
                room = _room(cap, free, margin, progress.bytes_read)
                if room <= 0:
                    break
                want = min(chunk, size - offset, room)
                got, free = await trio.to_thread.run_sync(
                    _read, fd, buffer[:want], offset, available
                )
                if got == 0:  # the file shrank since fstat: it is read
                    size = offset
                    break
                offset += got
                progress.bytes_read += got
        except OSError as exc:
            progress.skipped.append(Skipped(path, "unreadable", str(exc), offset))
            continue
        finally:
            os.close(fd)  # no thread uses it now: each call above has returned
        if offset < size:
            progress.skipped.append(_over(path, cap, free, margin, offset))
            rest = pending[index + 1 :]
            progress.skipped.extend(_over(later, cap, free, margin) for later in rest)
            break
        progress.read.append(path)
    progress.current = None
    progress.ended = trio.current_time()
    return progress.statistics()


def drop_cache(path: str) -> None:
    """Ask the kernel to drop ``path``'s pages from the page cache (``POSIX_FADV_DONTNEED``).

    Dirty pages are written out first (``fdatasync``), since the kernel drops only clean
    ones. Pages that a process has mapped (a running llama-server's ``mmap``) stay.
    Blocking: for benchmarks and tests, or ``trio.to_thread.run_sync``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class _NotAFile(OSError):
    pass


def _room(cap: float, free: int | None, margin: int, done: int) -> int:
    """Bytes that may still be read: the cap, and free memory above the margin, less
    what is read already (it is in the cache, which ``MemAvailable`` counts as free)."""
    limit = cap if free is None else min(cap, free - margin)
    return int(min(limit - done, 2**62))


def _over(path: str, cap: float, free: int | None, margin: int, done: int = 0) -> Skipped:
    """``path`` not read (or not to its end) for want of room; ``detail`` says which bound."""
    if free is not None and free - margin < cap:
        detail = f"{free} bytes of memory available, {margin} kept free"
    else:
        detail = f"budget of {int(cap)} bytes"
    return Skipped(path, "over budget", detail, done)


def _open(path: str) -> tuple[int, int, tuple[int, int]]:
    """Open ``path`` for a sequential read: its descriptor, size and (device, inode)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotAFile(f"{path!r} is not a regular file")
        # Doubles the kernel's readahead window for this descriptor: fewer, larger reads
        # queued ahead of the chunk being copied.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size, (info.st_dev, info.st_ino)


def _read(
    fd: int, view: memoryview, offset: int, available: Callable[[], int | None]
) -> tuple[int, int | None]:
    """One chunk (in a worker thread): bytes read, then free memory after it."""
    got = os.preadv(fd, [view], offset)
    return got, available()
