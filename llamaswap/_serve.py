"""``serve()``: owns the root nursery; starts the router, then hypercorn.

Task tree::

    serve                               the root nursery
    ├── open_lifeline                   guard process: models die with llamaswap
    ├── ActivityWriter.run              with [store]: activity records to SQLite, in batches
    │                                   (in a nursery around the rest: it stops last)
    │   (with [tracing]: OpenTelemetry's span exporter thread, flushed at the end, bounded)
    ├── EventHub.run                    the coalesced events of /api/events (the queue)
    ├── Router.run                      supervisors (one task per model) + swap nursery
    ├── hypercorn.trio.serve            one task per connection, the Application per request
    ├── Reloader.watch                  with --watch-config: reload when the file changes
    ├── Reloader.reload (per SIGHUP)    validate, then Router.reconfigure (SPEC §3.7)
    ├── Notifier.watchdog               under systemd with WatchdogSec=: WATCHDOG=1 pings
    └── signals                         SIGINT/SIGTERM → graceful shutdown (SPEC §8.3)

Shutdown: stop accepting, fail waiting requests with 503, give requests being served up
to ``unloadTimeout`` to finish, cancel those still running with a clear 503, stop every
model (polite, then SIGKILL), end the live streams, cancel what is left (writes to
clients that do not read too), write the activity records still buffered, return.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import signal
import ssl
import typing
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial

import attrs
import hypercorn.trio
import trio

from llamaswap._systemd import Notifier
from llamaswap.config.model import REQUEST_HEAD_TIMEOUT, Config, TracingConfig
from llamaswap.errors import ListenError, LlamaSwapError, RequestError, only_cause
from llamaswap.http import server as http_server
from llamaswap.http.server import ServerConfig
from llamaswap.observability import (
    ActivityLog,
    ActivityStore,
    ActivityWriter,
    EventHub,
    Logs,
    capture_logs,
)
from llamaswap.observability.logs import OWN_LOG_LINES
from llamaswap.observability.tracing import Tracing, open_tracing
from llamaswap.process import (
    HttpProbe,
    LogRing,
    ModelState,
    SlotKeeper,
    SubprocessSpawner,
    open_lifeline,
)
from llamaswap.proxy import UpstreamPool, create_app
from llamaswap.resources import Resources, open_probe
from llamaswap.router import Router, RouterEvent
from llamaswap.router.events import ModelStateChanged

__all__ = ["Tls", "listen_address", "serve"]

logger = logging.getLogger("llamaswap")

#: Seconds the live streams (/logs/stream, /api/events) get to end at shutdown.
LIVE_STREAMS_GRACE = 1.0


#: What a port may be, said with every bad one.
_PORTS = "0 to 65535; 0 picks a free port"


@attrs.frozen
class Tls:
    """``--tls-cert`` and ``--tls-key``: PEM files (the certificate may carry its chain)."""

    cert: str
    key: str

    def check(self) -> None:
        """Raises LlamaSwapError if the files are not a certificate and its key."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert, self.key)
        except OSError as exc:  # ssl.SSLError is one
            reason = exc.strerror or str(exc)
            raise LlamaSwapError(
                f"cannot serve HTTPS with --tls-cert {self.cert} and --tls-key {self.key}: "
                f"{reason}"
            ) from None


def listen_address(listen: str) -> tuple[str, int]:
    """The host and port of ``listen``: ``HOST:PORT``, an IPv6 host in brackets
    (``[::1]:8080``), the port from 0 to 65535 (0: any free port).

    Checked before hypercorn sees it, which would quietly serve ``''`` on 0.0.0.0:8000 (every
    interface), a host alone on port 8000, take ``unix:PATH`` (removing a socket file there)
    and ``fd://N``, and fail on port 99999 with a traceback.

    Raises:
        ListenError: ``listen`` is not such an address, saying what is wrong with it.
    """
    if listen.startswith(("unix:", "fd://")):
        return _bad(listen, "only a host and port can be listened on, not unix: or fd://")
    if listen.startswith("["):
        host, bracket, rest = listen[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return _bad(listen, "an address in brackets is written as in [::1]:8080")
        port = rest[1:] if rest else None
    elif ":" in listen:
        host, _, port = listen.rpartition(":")
        if ":" in host:
            return _bad(listen, f"a host with ':' in it goes in brackets, as in [{host}]:{port}")
    else:
        host, port = listen, None
    if not host:
        where = "no host and no port" if not port else "no host"
        return _bad(listen, f"{where} (as in 127.0.0.1:8080; 0.0.0.0:8080 is every interface)")
    shown = f"[{host}]" if ":" in host else host
    if not port:
        return _bad(listen, f"no port (as in {shown}:8080; port 0 picks a free port)")
    if not (port.isascii() and port.isdigit()):
        return _bad(listen, f"port {port!r} is not a number ({_PORTS})")
    if len(port) > 5 or int(port) > 65535:
        return _bad(listen, f"port {port} is out of range ({_PORTS})")
    return host, int(port)


def _bad(listen: str, reason: str) -> typing.NoReturn:
    raise ListenError(listen or "''", OSError(errno.EINVAL, reason))


def _hypercorn_config(
    listen: Sequence[str], current: Callable[[], Config], tls: Tls | None = None
) -> ServerConfig:
    settings = ServerConfig(current)
    if tls is not None:
        settings.certfile, settings.keyfile = tls.cert, tls.key
    addresses = [listen_address(address) for address in listen]
    settings.bind = [
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in addresses
    ]
    settings.accesslog = None
    # Through our logging setup rather than hypercorn's own handler (no double lines).
    settings.errorlog = logging.getLogger("hypercorn.error")
    # llamaswap's shutdown ends every connection itself, on its own bounds: requests get
    # unloadTimeout, then are cancelled each with a clear error; the models get theirs
    # before SIGKILL; the live streams then say so and end; and last, hypercorn is
    # cancelled. hypercorn must cut nothing before that (a bound of its own cut the live
    # streams before a model that ignores SIGTERM was stopped).
    settings.graceful_timeout = math.inf
    # hypercorn's idle timer runs from the moment a connection opens (or its previous
    # response ends) until a complete request head has arrived, so it is both the keep-alive
    # timeout and the bound on a slow request head. It is stopped while a request is being
    # answered, however long the answer waits or streams.
    settings.keep_alive_timeout = REQUEST_HEAD_TIMEOUT
    # Not read_timeout: it bounds every read on the connection, and a client waiting for its
    # answer (queued, a model loading, tokens streaming) sends nothing for minutes. The body
    # is bounded by the application instead (REQUEST_BODY_TIMEOUT, proxy/app.py).
    settings.read_timeout = None
    settings.keep_alive_max_requests = 2**31  # never close a busy client's connection
    settings.backlog = 2048  # a burst of clients must queue, not be reset (default 100)
    settings.h11_max_incomplete_size = 64 * 1024  # the largest request head
    settings.alpn_protocols = ["http/1.1"]  # HTTP/1.1 only, should TLS come
    # A model server's Server field comes back as it sent it (llama-server's clients may
    # read it); hypercorn's would be a second one.
    settings.include_server_header = False
    return settings


async def _preload(router: Router, model: str) -> None:
    """Load ``model`` at startup. A failure is logged, not fatal: requests try again."""
    try:
        await router.load(model)
    except RequestError as exc:
        logger.warning("preloading %r failed: %s", model, exc)


def _close_upstream_connections(router: Router, pool: UpstreamPool, event: RouterEvent) -> None:
    """A router observer: a model that stopped took its server with it, so the pool's idle
    connections to its address are closed. (With ``idleConn = 0`` nothing else would close
    them once that address is never used again: the model removed, or moved to another
    port; each would wait in CLOSE-WAIT for good.)"""
    if isinstance(event, ModelStateChanged) and event.state is ModelState.STOPPED:
        address = router.statistics(event.model).address
        if address is not None:
            pool.close_idle(address)


def _serving(router: Router, changed: ModelStateChanged | None = None) -> str:
    """The ``STATUS=`` line systemd shows while serving: the models ready."""
    ready = []
    for model in router.known_models():
        state = router.statistics(model).state
        if changed is not None and model == changed.model:
            state = changed.state
        if state is ModelState.READY:
            ready.append(model)
    return f"serving; models ready: {', '.join(ready) or 'none'}"


def _notify_models(router: Router, notifier: Notifier, event: RouterEvent) -> None:
    assert isinstance(event, ModelStateChanged)
    notifier.status(_serving(router, event))


async def _end_live_streams(hub: EventHub, logs: Logs) -> None:
    """After the models have stopped (so their clients saw that too), end every stream."""
    hub.close()
    logs.close()
    with trio.move_on_after(LIVE_STREAMS_GRACE):
        await hub.drained()
        await logs.drained()


@contextlib.asynccontextmanager
async def _writing(writer: ActivityWriter | None) -> AsyncIterator[None]:
    """Runs ``writer`` (if any) around the block: when the block is over, every request
    has finished and been recorded, and cancelling the writer writes what is left."""
    if writer is None:
        yield
        return
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        yield
        nursery.cancel_scope.cancel(reason="shut down: every request is recorded")


#: Seconds the spans still queued at the end may take to reach the collector: an
#: unreachable one must not hold llamaswap's exit.
TRACE_FLUSH = 5.0


@contextlib.asynccontextmanager
async def _traces(config: TracingConfig | None) -> AsyncIterator[Tracing | None]:
    """The tracing ``config`` asks for (None: off) around the block; after it, the spans
    still queued are sent from a worker thread, for at most ``TRACE_FLUSH`` seconds."""
    tracing = open_tracing(config)
    try:
        yield tracing
    finally:
        if tracing is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(TRACE_FLUSH):
                await trio.to_thread.run_sync(
                    partial(tracing.close, TRACE_FLUSH), abandon_on_cancel=True
                )


async def serve(
    config: Config,
    *,
    listen: Sequence[str],
    config_path: str | None = None,
    watch_config: bool = False,
    tls: Tls | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``config`` on every address of ``listen`` (``HOST:PORT``, see
    :func:`listen_address`) until SIGINT or SIGTERM.

    ``config_path`` is the file SIGHUP and ``POST /api/config/reload`` reload from (and,
    with ``watch_config``, reload whenever it changes). ``tls``: serve HTTPS with this
    certificate and key. ``task_status.started`` receives the URLs served, once requests
    are accepted.

    Raises:
        ConfigError: ``store.path`` cannot be opened as the activity store, or
            ``[tracing]`` asks for traces without the ``otel`` extra installed.
        ListenError: ``listen`` is not ``HOST:PORT`` or cannot be listened on (in use,
            not allowed).
    """
    for address in listen:
        listen_address(address)  # before anything starts
    http_server.install()
    activity = ActivityLog()
    store = writer = None
    if config.store is not None:
        store = ActivityStore.from_config(config.store)
        first_id = await trio.to_thread.run_sync(
            partial(store.open, config_file=config_path or "<config>")
        )
        logger.info("activity log kept in %s (records from #%d on are new)", store.path, first_id)
        activity = ActivityLog(first_id=first_id)
        writer = ActivityWriter(store)
        activity.add_listener(writer.put)
    own_log = LogRing(OWN_LOG_LINES)
    async with (
        capture_logs(own_log),  # llamaswap's own log, for /logs (removed when serve ends)
        _traces(config.tracing) as tracing,  # its last spans sent after every request ended
        _writing(writer),  # before anything that records, stopped after all of it
        open_lifeline() as lifeline,
        # No read or write timeout: a slow first token or a long pause is normal.
        UpstreamPool(connect_timeout=10.0) as pool,
        trio.open_nursery() as nursery,
    ):
        gpu, absent = await trio.to_thread.run_sync(open_probe)
        if gpu is None:
            logger.debug("no GPU figures: %s", absent)  # /api/resources says so too
        resources = Resources(config, gpu, absent=absent, store=store)
        router = Router(
            config,
            spawner=SubprocessSpawner(lifeline),
            probe=HttpProbe(pool),
            resources=resources,
            slots=SlotKeeper(pool),
        )
        router.observe(partial(_close_upstream_connections, router, pool), ModelStateChanged)
        hub = EventHub()
        logs = Logs.of(own_log, router)
        app = create_app(
            router,
            pool,
            config_path=config_path,
            hub=hub,
            logs=logs,
            activity=activity,
            store=store,
            listen_hosts=tuple(listen_address(address)[0] for address in listen),
            tracing=tracing,
        )
        await nursery.start(hub.run)
        await nursery.start(partial(resources.run, router.pids))
        await nursery.start(router.run)
        nursery.start_soon(app.model_server.run)
        await nursery.start(app.props.run)
        notifier = Notifier.from_env()
        nursery.start_soon(notifier.watchdog)
        if notifier.enabled:
            router.observe(partial(_notify_models, router, notifier), ModelStateChanged)
        stop_accepting = trio.Event()
        server_config = _hypercorn_config(listen, lambda: router.config, tls)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            try:
                binds = await nursery.start(
                    partial(
                        hypercorn.trio.serve,
                        app,
                        server_config,
                        shutdown_trigger=stop_accepting.wait,
                    )
                )
            except BaseException as exc:  # hypercorn's nurseries wrap the bind's OSError
                cause = only_cause(exc)
                if isinstance(cause, OSError):
                    raise ListenError(", ".join(listen), cause) from exc
                raise
            urls: list[str] = binds
            if watch_config and app.reloader is not None:
                await nursery.start(app.reloader.watch)
            for model in config.hooks.on_startup.preload:
                nursery.start_soon(_preload, router, config.resolve(model) or model)
            task_status.started(urls)
            notifier.ready(_serving(router))

            async def reload_notified() -> None:
                assert app.reloader is not None
                notifier.reloading()
                try:
                    await app.reloader.reload("SIGHUP")
                finally:
                    notifier.ready(_serving(router))

            async def shut_down() -> None:
                notifier.stopping()
                if app.reloader is not None:
                    app.reloader.close()
                stop_accepting.set()
                await router.shutdown(grace=router.config.unload_timeout)
                await _end_live_streams(hub, logs)
                nursery.cancel_scope.cancel(reason="shut down")

            # Signals stay handled until the end: one arriving during the shutdown must
            # not end the process at once (SIGHUP's default) while models are stopping.
            stopping = hurried = False
            async for signum in signals:
                name = signal.Signals(signum).name
                if stopping and signum == signal.SIGINT and not hurried:
                    # Ctrl-C during the shutdown: what its graces still wait for is given
                    # up. (A service manager's SIGTERM repeated, or SIGHUP, changes nothing.)
                    logger.warning(
                        "received SIGINT during the shutdown: stopping at once "
                        "(models killed, requests cut off)"
                    )
                    hurried = True
                    router.hurry()
                    nursery.cancel_scope.cancel(reason="stopped at once")
                elif stopping:
                    logger.info("received %s: already shutting down", name)
                elif signum == signal.SIGHUP:
                    if app.reloader is None:
                        logger.warning("received SIGHUP: no config file to reload from")
                    else:
                        nursery.start_soon(reload_notified)
                else:
                    logger.info("received %s: shutting down", name)
                    stopping = True
                    nursery.start_soon(shut_down)
