"""What a page-cache prefetch saves a load: llama-server's time to ``/health`` 200, cold
against prefetched (llamaswap/process/prefetch.py).

    python tests/benchmarks/bench_prefetch.py [--size-mb 600] [--rounds 5] [--model PATH]
                                              [--load-mode mmap --load-mode none]

Writes a random-weight llama GGUF of ``--size-mb`` (f32, wide layers, the tokenizer of
examples/tiny_model.py) unless ``--model`` names an existing file, then, for each of
llama-server's ``--load-mode``\\s and each round, in alternating order:

* cold: the file's pages dropped (``drop_cache``, nothing else maps it), then llama-server
  started and timed from spawn to the first 200 from ``/health`` (polled every 2 ms);
* prefetched: the pages dropped, ``prefetch()`` run (timed on its own), then the same.

Before every start it checks with ``mincore(2)`` how much of the file is resident, and
stops if a drop did not take (a tmpfs ``/tmp``: pass ``--model`` on a disk). Prints each
round, then the medians and their ratio. llama-server comes from the ``llamaserver``
extra, found by examples/llama_server_bin.py; on a CPU build the ``mmap`` mode reads the
weights in its warmup run, ``none`` reads them into buffers while loading.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import importlib.util
import math
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llamaswap.process.prefetch import drop_cache, prefetch
from tests.e2e.harness import REPO, free_port_base

EMBEDDING = 1024
FEED_FORWARD = 4096
HEADS = 8
MiB = 2**20


def write_model(path: Path, size: int) -> None:
    """A llama GGUF of at least ``size`` bytes: as many f32 layers as it takes."""
    import gguf

    # By path: mypy reads examples/ as top-level modules, so no package import of it.
    spec = importlib.util.spec_from_file_location("tiny_model", REPO / "examples/tiny_model.py")
    assert spec is not None
    assert spec.loader is not None
    tiny_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_model)

    tokens, scores, types = tiny_model.vocabulary()
    per_layer = 4 * (4 * EMBEDDING * EMBEDDING + 3 * EMBEDDING * FEED_FORWARD)
    layers = max(1, math.ceil(size / per_layer))
    rng = np.random.default_rng(28)

    def weight(rows: int, columns: int) -> np.ndarray[tuple[int, ...], np.dtype[np.float32]]:
        array = rng.standard_normal((rows, columns), dtype=np.float32)
        array *= columns**-0.5
        return array

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("random llama for bench_prefetch")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(2048)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBEDDING // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(tiny_model.UNK)
    writer.add_bos_token_id(tiny_model.BOS)
    writer.add_eos_token_id(tiny_model.EOS)
    ones = np.ones(EMBEDDING, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(len(tokens), EMBEDDING))
    for layer in range(layers):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weight(EMBEDDING, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(FEED_FORWARD, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(FEED_FORWARD, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(EMBEDDING, FEED_FORWARD))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(len(tokens), EMBEDDING))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def resident_fraction(path: Path) -> float:
    """The share of ``path``'s pages in the page cache, from ``mincore(2)`` on a mapping
    that is gone again when this returns (so it does not hold pages against a drop)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)
    return sum(byte & 1 for byte in bytes(vector)) / pages


def find_server(libs: Path) -> tuple[str, str]:
    """llama-server's path and its library folder, from examples/llama_server_bin.py."""
    found = subprocess.run(
        [sys.executable, str(REPO / "examples" / "llama_server_bin.py"), str(libs)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if found.returncode != 0:
        sys.exit(found.stderr.strip() or "llama-server not found")
    macros = dict(
        (name.strip(), value.strip().strip('"'))
        for name, _, value in (line.partition("=") for line in found.stdout.splitlines())
    )
    return macros["llama-server"], macros["llama-libs"]


@contextlib.contextmanager
def reaped(process: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def time_to_health(server: str, libs: str, model: Path, load_mode: str) -> float:
    """Seconds from spawning llama-server to its first ``/health`` 200."""
    port = free_port_base(1)
    argv = [server, "--host", "127.0.0.1", "--port", str(port), "-m", str(model)]
    argv += ["-c", "512", "-np", "1", "--load-mode", load_mode]
    env = {**os.environ, "LD_LIBRARY_PATH": libs}
    # Its log goes to a file: a pipe nobody reads would stall it once full.
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        spawned = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
        with reaped(spawned) as process:
            return _poll_health(process, port, started, log)


def _poll_health(
    process: subprocess.Popen[bytes], port: int, started: float, log: IO[bytes]
) -> float:
    deadline = started + 300
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            sys.exit(f"llama-server exited with status {process.returncode}:\n{tail}")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:  # 503 while it loads
                return time.perf_counter() - started
        except OSError:
            pass  # not listening yet
        finally:
            connection.close()
        time.sleep(0.002)
    sys.exit("llama-server was not healthy within 300 s")


def cold(path: Path) -> float:
    drop_cache(str(path))
    resident = resident_fraction(path)
    if resident > 0.05:
        sys.exit(
            f"{resident:.0%} of {path} stays cached after a drop (tmpfs, or another "
            "process maps it): pass --model on a disk-backed file system"
        )
    return resident


def run(model: Path, modes: list[str], rounds: int, server: str, libs: str) -> None:
    size = model.stat().st_size
    print(f"model {model} ({size / MiB:.0f} MiB), {rounds} rounds per mode, alternating")
    for mode in modes:
        times: dict[str, list[float]] = {"cold": [], "prefetched": []}
        prefetch_seconds: list[float] = []
        time_to_health(server, libs, model, mode)  # warms the binary and its libraries
        for round_ in range(rounds):
            order = ["cold", "prefetched"] if round_ % 2 == 0 else ["prefetched", "cold"]
            for kind in order:
                cold(model)
                if kind == "prefetched":
                    result = trio.run(prefetch, [str(model)])
                    assert result.read == (str(model),), result
                    prefetch_seconds.append(result.seconds)
                resident = resident_fraction(model)
                seconds = time_to_health(server, libs, model, mode)
                times[kind].append(seconds)
                print(
                    f"  --load-mode {mode:5} round {round_ + 1} {kind:10}  "
                    f"{seconds:7.3f} s to /health 200 ({resident:4.0%} cached at spawn)"
                )
        cold_median = statistics.median(times["cold"])
        warm_median = statistics.median(times["prefetched"])
        prefetch_median = statistics.median(prefetch_seconds)
        print(
            f"--load-mode {mode}: median cold {cold_median:.3f} s, prefetched "
            f"{warm_median:.3f} s: ratio {cold_median / warm_median:.2f}x (best of each: "
            f"{min(times['cold']):.3f} s, {min(times['prefetched']):.3f} s); the prefetch "
            f"itself: median {prefetch_median:.3f} s ({size / MiB / prefetch_median:.0f} MiB/s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=600, help="size of the model to write")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", type=Path, help="a GGUF file to use (written if missing)")
    parser.add_argument(
        "--load-mode",
        action="append",
        choices=["mmap", "none", "dio"],
        help="llama-server's --load-mode (repeatable; default: mmap and none)",
    )
    args = parser.parse_args()
    model = args.model or Path(tempfile.gettempdir()) / f"bench-prefetch-{args.size_mb}mb.gguf"
    if not model.exists():
        print(f"writing {model} ...", flush=True)
        write_model(model, args.size_mb * MiB)
    with tempfile.TemporaryDirectory() as libs_folder:
        server, libs = find_server(Path(libs_folder))
        run(model, args.load_mode or ["mmap", "none"], args.rounds, server, libs)


if __name__ == "__main__":
    main()
