"""The fake server's command line and process lifetime: bind, load, serve, handle signals."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from llamaswap.config.values import parse_sizes_option
from llamaswap.resources.probe import FAKE_GPU_ENV

from ._app import FakeServer, Options, complain, say
from ._gpu import OutOfMemory, allocate, allocate_cuda, release

# --- process lifetime -------------------------------------------------------------------------


def _hypercorn_config(options: Options) -> Config:
    """Bind the listening socket here, so a busy port is a plain OSError, then hand it over."""
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((options.host, options.port))
    except OSError:
        sock.close()
        raise
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn takes ownership of the descriptor
    config.loglevel = "WARNING"
    # Outlive the clients' idle timeouts (llamaswap's pool: 4 s, httpx: 5 s) so the client,
    # never the server, closes an idle keep-alive connection: no request races a close.
    config.keep_alive_timeout = 75.0
    config.keep_alive_max_requests = 2**31
    config.graceful_timeout = 1.0  # after SIGTERM, in-flight responses get this long
    return config


async def _run(options: Options) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0) or a (simulated) failure (status 1)."""
    started = trio.current_time()
    app = FakeServer(options)
    try:
        config = _hypercorn_config(options)
    except OSError as exc:
        complain(f"error: cannot listen on {options.host}:{options.port}: {exc}")
        return 1
    shutdown = trio.Event()
    exit_code = 0

    # The receiver is open before the port is announced: a supervisor may signal at once.
    # ``cleanup`` gives back the --memory allocation however this ends (but SIGKILL).
    with (
        contextlib.ExitStack() as cleanup,
        trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
    ):
        async with trio.open_nursery() as nursery:

            async def serve_then_stop(*, task_status: trio.TaskStatus[list[str]]) -> None:
                await serve(
                    app,
                    config,
                    shutdown_trigger=shutdown.wait,
                    mode="asgi",
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel(reason="server shut down")

            async def load() -> None:
                nonlocal exit_code
                await trio.sleep_until(started + options.load_seconds)
                if options.fail_start:
                    complain(f"error: failed to load model file '{options.model_name}.gguf'")
                    exit_code = 1
                    nursery.cancel_scope.cancel(reason="simulated load failure")
                    return
                if options.memory and options.cuda:
                    try:
                        tensors = await trio.to_thread.run_sync(allocate_cuda, options.memory)
                    except Exception as exc:  # torch.OutOfMemoryError: say it as PyTorch does
                        kind = type(exc)
                        complain(f"{kind.__module__}.{kind.__qualname__}: {exc}")
                        exit_code = 1
                        nursery.cancel_scope.cancel(reason="allocation failed")
                        return
                    cleanup.callback(tensors.clear)
                elif options.memory and options.gpu_dir:  # after the load, as llama.cpp
                    try:
                        allocation = await trio.to_thread.run_sync(
                            allocate, Path(options.gpu_dir), options.memory
                        )
                    except OutOfMemory as exc:
                        failure = exc.lines()
                    except OSError as exc:
                        failure = [f"error: cannot allocate in {options.gpu_dir}: {exc}"]
                    else:
                        cleanup.callback(release, allocation)
                        failure = []
                    if failure:
                        for line in failure:
                            complain(line)
                        exit_code = 1
                        nursery.cancel_scope.cancel(reason="simulated allocation failure")
                        return
                app.healthy = True
                say(f"healthy at {time.time():.6f}")

            async def watch_signals() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGTERM and options.ignore_sigterm:
                        say(f"received {name}, ignoring it (--ignore-sigterm)")
                        continue
                    say(f"received {name}")
                    shutdown.set()

            (url,) = await nursery.start(serve_then_stop)
            say(f"listening on {url} model={options.model_name} pid={os.getpid()}")
            nursery.start_soon(watch_signals)
            nursery.start_soon(load)
    return exit_code


def _number(kind: type[int] | type[float], minimum: int = 0) -> Callable[[str], Any]:
    """An argparse ``type`` accepting finite numbers >= ``minimum``."""

    def convert(text: str) -> int | float:
        value = kind(text)
        if not minimum <= value < math.inf:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {text!r}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its error messages
    return convert


def _fraction(text: str) -> float:
    """``--kv-cache-usage``'s argparse ``type``: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


def _memory(text: str) -> dict[str, int]:
    """``--memory``'s argparse ``type``."""
    try:
        return parse_sizes_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> Options:
    """Parse the command line into :class:`Options`."""
    parser = argparse.ArgumentParser(
        prog="python -m llamaswap.fake_server",
        description="A deterministic OpenAI-compatible stand-in for llama-server that simulates "
        "slow loads, token rates, failed starts, crashes and stubborn shutdowns. It logs one "
        "line per event to stdout.",
    )
    seconds, count = _number(float), _number(int)
    add = parser.add_argument
    # fmt: off
    add("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    add("--port", type=_number(int), required=True, help="port to bind; 0 picks a free one")
    add("--model-name", default="fake", help="model id it reports (default: %(default)s)")
    add("--load-seconds", type=seconds, default=0.0, metavar="S",
        help="/health answers 503 until S seconds after start (default: %(default)s)")
    add("--tokens-per-second", type=seconds, default=0.0, metavar="R",
        help="generation speed; 0 = as fast as possible (default: %(default)s)")
    add("--max-tokens", type=count, default=16, metavar="N",
        help="response length when the request sets no max_tokens (default: %(default)s)")
    add("--fail-start", action="store_true",
        help="after --load-seconds, print a load error to stderr and exit with status 1")
    add("--crash-after-tokens", type=count, metavar="N",
        help="after generating N tokens of a response, exit at once with status 3")
    add("--ignore-sigterm", action="store_true",
        help="log SIGTERM and keep running (SIGKILL or SIGINT still stop it)")
    add("--ignore-prefill", action="store_true",
        help="answer a chat whose last message is the assistant's from scratch, as a server "
        "without prefill support does, instead of continuing that message")
    add("--embedding-size", type=_number(int, minimum=1), default=8, metavar="N",
        help="length of /v1/embeddings vectors (default: %(default)s)")
    add("--parallel", type=count, default=0, metavar="N",
        help="completions generated at once, the rest wait their turn, as llama-server's "
        "slots; 0 = no limit (default: %(default)s)")
    add("--memory", type=_memory, default={}, metavar="SIZE",
        help="GPU memory to allocate once loaded: 8GiB (on gpu0), or gpu0=6GiB,gpu1=2GiB; "
        "it fails as llama.cpp does (CUDA out of memory) where that exceeds a device of "
        "--gpu-dir")
    add("--gpu-dir", metavar="DIR",
        help="the GPU probe's test double to allocate --memory in (devices.json, PID.json); "
        "default: $LLAMASWAP_FAKE_GPU")
    add("--slot-save-path", metavar="DIR",
        help="the directory POST /slots/{id}?action=save|restore writes and reads slot files "
        "in, as llama-server's; without it those answer 501")
    add("--kv-cache-usage", type=_fraction, metavar="F",
        help="serve GET /metrics with llamacpp:kv_cache_usage_ratio F (0-1), as llama-server "
        "--metrics does; without it there is no /metrics")
    add("--cors-origins", type=_origins, default=("*",), metavar="LIST",
        help="comma-separated origins whose pages it names back in Access-Control-Allow-Origin "
        "(with Access-Control-Allow-Credentials: true) and whose preflights it answers, as "
        "llama-server does for any page; '' = none, as a server without CORS "
        "(default: *, any)")
    add("--cuda", action="store_true",
        help="allocate --memory for real on the GPUs (gpuN is cuda:N) with PyTorch, held "
        "until exit; PyTorch's out-of-memory error is printed and the server exits 1")
    # fmt: on
    args = parser.parse_args(argv)
    if args.port > 65535:
        parser.error(f"--port must be at most 65535, got {args.port}")
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        parser.error(f"--slot-save-path: not a directory: {args.slot_save_path}")  # as llama.cpp
    if args.gpu_dir is None:
        args.gpu_dir = os.environ.get(FAKE_GPU_ENV) or None
    return Options(**{name: getattr(args, name) for name in attrs.fields_dict(Options)})


def _origins(text: str) -> tuple[str, ...]:
    return tuple(origin.strip() for origin in text.split(",") if origin.strip())


def main(argv: list[str] | None = None) -> None:
    """Run the fake server; exits with status 1 on a (simulated) start failure."""
    options = parse_args(argv)
    exit_code = trio.run(_run, options)
    if exit_code:
        sys.exit(exit_code)
