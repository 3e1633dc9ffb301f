"""The gap between stop and spawn in a swap, and readiness detection (issue 28).

    git worktree add /tmp/before HEAD~1
    python tests/benchmarks/bench_swap_gap.py [--other /tmp/before] [--swaps 60]

Swaps two fake model servers back and forth through a real ``Router`` (the one in each
checkout: ``router.load`` as ``POST /api/models/load`` does, so each load stops the other
model, then starts its own), and times each step from outside llamaswap's code, so the
same script measures any checkout:

* **exit**: when the old server's process exited, seen by a thread of this script that
  waits on the process's pidfd (not through Trio, nor the supervisor);
* **reaped**: when the supervisor's ``wait()`` on that process returned;
* **spawn**: when the supervisor called ``Spawner.spawn`` for the new one, and
  **spawned**: when that returned (``fork`` and ``exec`` done);
* **healthy**: the new server's own ``healthy at T`` stamp (``time.time()``, printed the
  moment its ``/health`` turns 200), against **ready**: when the router was told the
  model is ready (its state listener). Both are the same machine's wall clock.

Each checkout runs in its own worker process (``--worker``), the checkouts alternating in
blocks, so that whatever else the machine does hits both alike. Prints medians and p90
over every swap.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BLOCKS = 4

#: What each swap is timed by, in the order printed: (label, from, to).
FIGURES = (
    ("stop requested → old server exited", "stopping", "exit"),
    ("exit → reaped by the supervisor", "exit", "reaped"),
    ("reaped → old model stopped", "reaped", "stopped"),
    ("stopped → new model starting", "stopped", "starting"),
    ("starting → spawn called", "starting", "spawn"),
    ("  of which the port check", "check_start", "check_end"),
    ("spawn called → spawned (fork, exec)", "spawn", "spawned"),
    ("gap: exit → spawn called", "exit", "spawn"),
    ("gap: exit → spawned", "exit", "spawned"),
    ("readiness: healthy → ready", "healthy", "ready"),
    ("  healthy → the probe that saw it began", "healthy", "probe_start"),
    ("  the probe that saw it", "probe_start", "probe_end"),
    ("  the same probe of the warm server", "warm_start", "warm_end"),
    ("load requested → ready", "load", "ready"),
)
#: Figures from the spawns of ``true`` after the swaps: (label, kind).
REFERENCES = (
    ("spawn of `true` with the lifeline (fork)", "fork"),
    ("spawn of `true` without it (vfork)", "vfork"),
    ("the worker's peak RSS, MB (not ms)", "rss"),
)

CONFIG = """
startPort = {port}
healthCheckTimeout = 30
minResidency = 0
[models.a]
cmd = {cmd_a}
[models.b]
cmd = {cmd_b}
"""


# ------------------------------------------------------------------------- the worker


def worker(source: Path, swaps: int, port: int) -> None:
    """Run ``swaps`` swaps with the llamaswap in ``source``; one JSON line per swap."""
    sys.path.insert(0, str(source))
    import trio

    # All of llamaswap is imported, so the process forks at a real one's size.
    from llamaswap._serve import _close_upstream_connections
    from llamaswap.config.load import loads_config
    from llamaswap.http.client import UpstreamPool
    from llamaswap.process import HttpProbe, SubprocessSpawner, open_lifeline
    from llamaswap.router import Router
    from llamaswap.router.events import ModelStateChanged

    marks: dict[str, float] = {}  # this swap's moments (time.time())
    probes: list[tuple[float, float, bool]] = []

    class TimedHandle:
        def __init__(self, handle: Any) -> None:
            self._handle = handle
            self.exited_at: float | None = None
            self.reaped_at: float | None = None
            fd = os.pidfd_open(handle.pid)
            threading.Thread(target=self._watch, args=(fd,), daemon=True).start()

        def _watch(self, fd: int) -> None:
            select.select([fd], [], [])
            self.exited_at = time.time()
            os.close(fd)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._handle, name)

        async def wait(self) -> int:
            code: int = await self._handle.wait()
            if self.reaped_at is None:
                self.reaped_at = time.time()
            return code

    class TimedSpawner:
        def __init__(self, inner: Any) -> None:
            self._inner = inner
            self.last: TimedHandle | None = None

        async def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> TimedHandle:
            marks["spawn"] = time.time()
            handle = TimedHandle(await self._inner.spawn(argv, env))
            marks["spawned"] = time.time()
            self.last = handle
            return handle

        async def run(self, argv: Sequence[str], env: Mapping[str, str], sink: Any) -> int:
            code: int = await self._inner.run(argv, env, sink)
            return code

    class TimedProbe:
        def __init__(self, inner: Callable[[str], Any]) -> None:
            self._inner = inner

        async def __call__(self, url: str) -> bool:
            started = time.time()
            ok: bool = await self._inner(url)
            probes.append((started, time.time(), ok))
            return ok

    fake = [sys.executable, "-m", "llamaswap.fake_server", "--port", "${PORT}"]
    text = CONFIG.format(
        port=port,
        cmd_a=json.dumps([*fake, "--model-name", "a"]),
        cmd_b=json.dumps([*fake, "--model-name", "b"]),
    )
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as file:
        file.write(text)
        file.flush()
        config = loads_config(text, file=file.name)

    async def main() -> None:
        async with open_lifeline() as lifeline, UpstreamPool() as pool:
            spawner = TimedSpawner(SubprocessSpawner(lifeline))
            probe = HttpProbe(pool)
            router = Router(config, spawner=spawner, probe=TimedProbe(probe))

            def on_state(event: Any) -> None:
                if isinstance(event, ModelStateChanged):
                    marks.setdefault(event.state.value, time.time())

            router.observe(on_state, ModelStateChanged)
            # As serve() does: a stopped model's idle connections are closed.
            router.observe(partial(_close_upstream_connections, router, pool), ModelStateChanged)
            healthy: dict[str, float] = {}
            seen = trio.Event()  # this swap's "healthy at" line has come
            for model, ring in router.log_rings().items():

                def on_line(line: Any, model: str = model) -> None:
                    if found := re.search(r"healthy at ([0-9.]+)", line.text):
                        healthy[model] = float(found[1])
                        seen.set()

                ring.subscribe(on_line)
            async with trio.open_nursery() as nursery:
                await nursery.start(router.run)
                with trio.fail_after(60):
                    await router.load("a")
                for index in range(swaps):
                    model = "b" if index % 2 == 0 else "a"
                    old = spawner.last
                    assert old is not None
                    marks.clear()
                    probes.clear()
                    healthy.pop(model, None)
                    seen = trio.Event()
                    marks["load"] = time.time()
                    with trio.fail_after(60):
                        await router.load(model)
                        await seen.wait()  # the line may come after ready
                    marks["healthy"] = healthy[model]
                    assert old.exited_at is not None
                    assert old.reaped_at is not None
                    marks["exit"], marks["reaped"] = old.exited_at, old.reaped_at
                    before = [p for p in probes if p[0] < marks["spawn"]]
                    if before:  # the check that nothing answers on the port yet
                        marks["check_start"], marks["check_end"] = before[-1][:2]
                    marks["probe_start"], marks["probe_end"] = max(p[:2] for p in probes if p[2])
                    # The same probe of the server once it is warm, for comparison.
                    marks["warm_start"] = time.time()
                    url = config.models[model].health_url
                    assert url is not None
                    assert await probe(url)
                    marks["warm_end"] = time.time()
                    print(json.dumps({"kind": "swap", **marks}), flush=True)
                with trio.fail_after(60):
                    await router.unload()
                # What the spawn costs in this process, with the lifeline's preexec_fn (fork)
                # and without it (vfork, which the lifeline's design rules out).
                true = shutil.which("true") or "/bin/true"
                for name, plain in (("fork", spawner._inner), ("vfork", SubprocessSpawner())):
                    for _ in range(10):
                        started = time.time()
                        handle = await plain.spawn([true], dict(os.environ))
                        ended = time.time()
                        await handle.wait()
                        await handle.pump_output(lambda line: None)
                        print(json.dumps({"kind": name, "start": started, "end": ended}))
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # peak, MB
                print(json.dumps({"kind": "rss", "start": 0, "end": rss / 1e3}), flush=True)
                nursery.cancel_scope.cancel()

    trio.run(main)


# ------------------------------------------------------------------------- the parent


def run_block(source: Path, swaps: int, port: int) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    argv = [sys.executable, __file__, "--worker", str(source), "--swaps", str(swaps)]
    argv += ["--port", str(port)]
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cell(spans: list[float]) -> str:
    if not spans:
        return "-"
    return f"{statistics.median(spans):.2f} / {percentile(spans, 0.9):.2f}"


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    names = list(results)
    print(f"{'ms, median / p90':<44}" + "".join(f"{name[-24:]:>26}" for name in names))
    for label, start, end in FIGURES:
        row = f"{label:<44}"
        for name in names:
            swaps = [r for r in results[name] if r["kind"] == "swap"]
            spans = [1e3 * (r[end] - r[start]) for r in swaps if start in r and end in r]
            row += f"{cell(spans):>26}"
        print(row)
    for label, kind in REFERENCES:
        row = f"{label:<44}"
        for name in names:
            spans = [1e3 * (r["end"] - r["start"]) for r in results[name] if r["kind"] == kind]
            row += f"{cell(spans):>26}"
        print(row)
    counts = [
        f"{sum(r['kind'] == 'swap' for r in results[name])} swaps ({name})" for name in names
    ]
    print("N = " + ", ".join(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", type=Path, help="another llamaswap checkout, side by side")
    parser.add_argument("--swaps", type=int, default=60, help="swaps per checkout")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker is not None:
        worker(options.worker, options.swaps, options.port)
        return
    sys.path.insert(0, str(REPO))
    from tests.e2e.harness import free_port_base

    sources = {"this checkout": REPO}
    if options.other is not None:
        sources[f"other ({options.other.resolve()})"] = options.other.resolve()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    for block in range(BLOCKS):
        order = list(sources.items())
        for name, source in order if block % 2 else order[::-1]:
            port = free_port_base(2)
            results[name] += run_block(source, -(-options.swaps // BLOCKS), port)
    report(results)


if __name__ == "__main__":
    main()
