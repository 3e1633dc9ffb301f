#!/usr/bin/env python3
"""Watch llamaswap's ``serial`` scheduler decide who goes next.

Three small experiments against a proxy running ``examples/priority-bands/config.toml``
(README.md next to this file explains how to read what they print):

``bands``
    Six ``batch`` requests wait behind a long generation; two ``interactive`` requests
    arrive after them and still go first, although they need a swap and the batch ones
    do not.
``affinity``
    With ``chat`` loaded, an older request for ``coder`` and a newer one for ``chat``
    wait. The newer one goes first: serving it before swapping saves a swap.
``aging``
    One ``batch`` request waits while a steady trickle of fresh ``normal`` requests keeps
    the model busy. Every ``agingDivisor`` of waiting is worth a point, so it eventually
    outscores the newcomers and is served before some of them.

How the experiments stay deterministic: each one first *holds the slot* with a long
streaming request (the "blocker"), queues its requests one at a time -- sending the next
only once ``/metrics`` shows the proxy has admitted the previous one, so arrival order is
known -- and then hangs up on the blocker, which frees the slot and lets the scheduler
pick. Nothing sleeps to "let things happen"; every step waits for an answer.

The verdicts (``CLAIM ...: yes``/``no``) are computed from the proxy's own records
(``GET /api/activity`` and ``/metrics``), not from what this script expects. The exit
status is 0 when every claim holds, 1 when one does not, 2 when the demo could not run.
``--json PATH`` also writes those records, matched to the requests sent, so that a
program can check the timeline itself (README.md describes the format).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import functools
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "config.toml"
DEFAULT_URL = "http://127.0.0.1:8080"
PRIORITY_HEADER = "X-LlamaSwap-Priority"
CHAT = "/v1/chat/completions"
LISTENING = re.compile(r"llamaswap: listening on (?P<url>http://\S+)")
SCENARIOS = ("bands", "affinity", "aging")
DESCRIPTION = "Watch llamaswap's serial scheduler decide who goes next (see README.md)."

#: The two models of config.toml; no groups, so only one runs at a time.
LOADED, OTHER = "chat", "coder"
#: Long enough to outlast any experiment's setup; the demo hangs up on it well before.
BLOCKER_TOKENS = 4000
#: A short answer (0.2 s at 20 tokens a second): enough to show an order.
SHORT_TOKENS = 4
#: The aging experiment's fresh requests: 1 s each, so the feeder has time to top up.
FEEDER_TOKENS = 20
#: How many fresh normal requests the aging experiment keeps waiting at all times.
FEEDER_DEPTH = 2
#: How often to re-read /metrics while waiting for the proxy to admit or pick something.
POLL_SECONDS = 0.02
#: The counters each scenario reads before and after it plays (and --json writes).
COUNTERS = (
    "llamaswap_scheduler_aging_changed_pick_total",
    "llamaswap_scheduler_affinity_changed_pick_total",
)


class DemoError(Exception):
    """The demo could not run (proxy unreachable, a request failed, a timeout)."""


@dataclasses.dataclass(frozen=True)
class Sent:
    """A request this demo sent; ``order`` is its arrival rank, confirmed by the proxy."""

    label: str
    model: str
    priority: str
    order: int


@dataclasses.dataclass(frozen=True)
class Row:
    """One request as the proxy's activity log tells it; times relative to the experiment."""

    sent: Sent
    band: str
    priority: int
    affinity: bool
    score: float
    wait: float
    arrival: float
    start: float
    finish: float
    status: int


@dataclasses.dataclass(frozen=True)
class Claim:
    scenario: str
    text: str
    holds: bool
    detail: str

    def line(self) -> str:
        return f"CLAIM {self.scenario}: {self.text}: {'yes' if self.holds else 'no'}"


@dataclasses.dataclass(frozen=True)
class Played:
    """One scenario's claims, and the data they were computed from (for ``--json``)."""

    scenario: str
    claims: list[Claim]
    #: In arrival order: what was sent, and the proxy's activity record of it.
    requests: list[dict[str, Any]]
    #: ``COUNTERS`` from /metrics, before and after the scenario.
    counters: dict[str, dict[str, float]]

    def document(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "requests": self.requests,
            "counters": self.counters,
            "claims": [
                {"text": claim.text, "holds": claim.holds, "detail": claim.detail}
                for claim in self.claims
            ],
        }


# --------------------------------------------------------------------------- the proxy


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to ``{'name{labels}': value}`` (comments and blank lines skipped)."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            values[key] = float(value)
    return values


def depth(metrics: Mapping[str, float], band: str) -> float:
    return metrics.get(f'llamaswap_scheduler_queue_depth{{band="{band}"}}', 0.0)


def admitted(metrics: Mapping[str, float], band: str) -> float:
    """Requests of ``band`` ever admitted: dispatched so far plus waiting now.

    It only grows (nobody cancels here), so "one more than before I sent it" proves the
    proxy has the request, whatever the scheduler picked in the meantime.
    """
    dispatched = metrics.get(f'llamaswap_scheduler_dispatch_total{{band="{band}"}}', 0.0)
    return dispatched + depth(metrics, band)


def band_of(priority: str) -> str:
    return {"interactive": "interactive", "batch": "batch"}.get(priority, "normal")


def chat_body(model: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "say something short"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def parse_time(iso: str) -> float:
    """An activity record's ``time`` (UTC, ``...Z``) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Proxy:
    """What the demo asks the proxy: metrics, activity, readiness."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def metrics(self) -> dict[str, float]:
        response = await self.client.get("/metrics")
        response.raise_for_status()
        return parse_metrics(response.text)

    async def activity(self, limit: int) -> list[dict[str, Any]]:
        response = await self.client.get("/api/activity", params={"limit": limit})
        response.raise_for_status()
        records: list[dict[str, Any]] = response.json()["activity"]
        return records

    async def newest_activity_id(self) -> int:
        records = await self.activity(1)
        return int(records[0]["id"]) if records else 0

    async def wait_for(
        self, what: str, condition: Callable[[dict[str, float]], bool], *, within: float = 30.0
    ) -> dict[str, float]:
        """Re-read /metrics until ``condition`` holds; the metrics that satisfied it."""
        with trio.move_on_after(within):
            while True:
                if condition(metrics := await self.metrics()):
                    return metrics
                await trio.sleep(POLL_SECONDS)
        raise DemoError(f"gave up after {within:g} s waiting for {what}")

    async def check(self) -> None:
        """Fail early, with a hint, unless this looks like the example's proxy."""
        try:
            response = await self.client.get("/v1/models")
        except httpx.TransportError as exc:
            raise DemoError(
                f"cannot reach a proxy at {self.client.base_url} ({exc}); start one with "
                "`llamaswap --config examples/priority-bands/config.toml`, or pass --spawn"
            ) from exc
        response.raise_for_status()
        models = {entry["id"] for entry in response.json()["data"]}
        if not {LOADED, OTHER} <= models:
            raise DemoError(
                f"the proxy at {self.client.base_url} serves {sorted(models)}, not "
                f"{LOADED!r} and {OTHER!r}: start it with examples/priority-bands/config.toml"
            )


# ---------------------------------------------------------------------- an experiment


class Experiment:
    """One scenario's requests: who was sent in which order, who finished in which order."""

    def __init__(self, proxy: Proxy, nursery: trio.Nursery) -> None:
        self.proxy = proxy
        self.nursery = nursery
        self.sent: list[Sent] = []
        self.finished: list[str] = []
        self.failures: list[str] = []
        #: Each request's activity record, by label (filled in by ``timeline``).
        self.records: dict[str, dict[str, Any]] = {}
        self.began = trio.current_time()

    def say(self, message: str) -> None:
        print(f"  [{trio.current_time() - self.began:5.1f}s] {message}", flush=True)

    async def hold_slot(self, model: str) -> trio.Event:
        """Start the blocker on ``model``; returns once it generates. Set the event to hang up."""
        release = trio.Event()
        await self.nursery.start(self._blocker, model, release)
        self.say(f"blocker: {model!r} is loaded and generating; it holds the one slot")
        return release

    async def _blocker(
        self, model: str, release: trio.Event, *, task_status: trio.TaskStatus[None]
    ) -> None:
        sent = self._record("blocker", model, "normal")
        body = chat_body(model, BLOCKER_TOKENS, stream=True)
        headers = {PRIORITY_HEADER: sent.priority}
        async with self.proxy.client.stream("POST", CHAT, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                raise DemoError(f"blocker: HTTP {response.status_code}: {response.text[:300]}")
            chunks = response.aiter_raw()
            try:
                try:
                    await anext(chunks)  # the first token: the model is loaded, the slot is ours
                except StopAsyncIteration:
                    raise DemoError("blocker: the answer ended before its first token") from None
                task_status.started()
                await release.wait()
            finally:
                # Closing the iterator hangs up too: only now, not after the first token.
                if isinstance(chunks, AsyncGenerator):
                    await chunks.aclose()
        # Hanging up closed the connection: the proxy sees a disconnect, stops the
        # generation and frees the slot, and the scheduler picks among the waiting requests.
        self.finished.append(sent.label)

    async def send(self, label: str, model: str, priority: str, max_tokens: int) -> Sent:
        """Send a request and return once the proxy has admitted it."""
        band = band_of(priority)
        before = admitted(await self.proxy.metrics(), band)
        sent = self._record(label, model, priority)
        self.nursery.start_soon(self._request, sent, max_tokens)
        await self.proxy.wait_for(
            f"{label!r} to be admitted", lambda metrics: admitted(metrics, band) > before
        )
        return sent

    async def _request(self, sent: Sent, max_tokens: int) -> None:
        body = chat_body(sent.model, max_tokens)
        try:
            response = await self.proxy.client.post(
                CHAT, json=body, headers={PRIORITY_HEADER: sent.priority}
            )
        except httpx.HTTPError as exc:
            self.failures.append(f"{sent.label}: {exc!r}")
        else:
            if response.status_code != 200:
                self.failures.append(f"{sent.label}: HTTP {response.status_code}: {response.text}")
        self.finished.append(sent.label)

    def _record(self, label: str, model: str, priority: str) -> Sent:
        sent = Sent(label, model, priority, order=len(self.sent))
        self.sent.append(sent)
        return sent

    async def timeline(self, after_id: int) -> list[Row]:
        """Match the proxy's activity records to the requests sent, sorted by start.

        Records are numbered as requests finish; one request is served at a time, so the
        n-th new record is the n-th request to finish here (model and band must agree).
        """
        if self.failures:
            raise DemoError("requests failed: " + "; ".join(self.failures))
        count = len(self.finished)

        def new(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [r for r in records if r["id"] > after_id and r["path"] == CHAT]

        # The proxy files a record just after the response's last byte: wait for the last.
        records: list[dict[str, Any]] = []
        with trio.move_on_after(10):
            while True:
                records = new(await self.proxy.activity(count + 100))
                if len(records) >= count:
                    break
                await trio.sleep(POLL_SECONDS)
        if len(records) != count:
            raise DemoError(f"expected {count} new activity records, found {len(records)}")
        schedulers = {str(record["scheduler"]) for record in records}
        if schedulers != {"serial"}:
            names = ", ".join(map(repr, sorted(schedulers)))
            raise DemoError(
                f"the proxy runs the {names} scheduler, not 'serial': "
                "start it with examples/priority-bands/config.toml"
            )
        records.sort(key=lambda record: int(record["id"]))
        by_label = {sent.label: sent for sent in self.sent}
        origin = min(parse_time(record["time"]) for record in records)
        rows = []
        for label, record in zip(self.finished, records, strict=True):
            sent = by_label[label]
            if (record["model"], record["band"]) != (sent.model, band_of(sent.priority)):
                raise DemoError(
                    f"activity record #{record['id']} ({record['model']}, {record['band']}) "
                    f"does not match {label!r}: is someone else using this proxy?"
                )
            self.records[label] = record
            arrival = parse_time(record["time"]) - origin
            wait = float(record["queue_wait_ms"]) / 1000
            rows.append(
                Row(
                    sent=sent,
                    band=record["band"],
                    priority=int(record["priority"]),
                    affinity=bool(record["metadata"].get("affinity", False)),
                    score=float(record["score"]),
                    wait=wait,
                    arrival=arrival,
                    start=arrival + wait,
                    finish=arrival + float(record["duration_ms"]) / 1000,
                    status=int(record["status"]),
                )
            )
        return sorted(rows, key=lambda row: row.start)

    def requests(self) -> list[dict[str, Any]]:
        """Every request in arrival order, with its activity record (after ``timeline``)."""
        return [
            {
                "label": sent.label,
                "model": sent.model,
                "priority_header": sent.priority,
                "order": sent.order,
                "activity": self.records[sent.label],
            }
            for sent in self.sent
        ]


def print_table(rows: Sequence[Row]) -> None:
    header = (
        f"  {'request':<14} {'model':<6} {'band':<12} {'priority':>8} {'affinity':>8} "
        f"{'score':>8} {'waited':>7} {'start':>7} {'finish':>7}  status"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for row in rows:
        print(
            f"  {row.sent.label:<14} {row.sent.model:<6} {row.band:<12} {row.priority:>8} "
            f"{'+' if row.affinity else '-':>8} {row.score:>8.1f} {row.wait:>6.2f}s "
            f"{row.start:>6.2f}s {row.finish:>6.2f}s  {row.status}"
        )


def swaps(rows: Sequence[Row]) -> int:
    """Model changes along ``rows`` (the first row's model was already loaded)."""
    return sum(
        1 for before, after in itertools.pairwise(rows) if before.sent.model != after.sent.model
    )


def counter_claim(
    scenario: str, name: str, before: Mapping[str, float], after: Mapping[str, float]
) -> Claim:
    old, new = before.get(name, 0.0), after.get(name, 0.0)
    return Claim(scenario, f"{name} went up", new > old, f"{old:g} -> {new:g}")


def played(
    scenario: str,
    lab: Experiment,
    claims: list[Claim],
    before: Mapping[str, float],
    after: Mapping[str, float],
) -> Played:
    counters = {
        "before": {name: before.get(name, 0.0) for name in COUNTERS},
        "after": {name: after.get(name, 0.0) for name in COUNTERS},
    }
    return Played(scenario, claims, lab.requests(), counters)


# ------------------------------------------------------------------------ the scenarios


@contextlib.asynccontextmanager
async def experiment(name: str, proxy: Proxy, intro: str) -> AsyncIterator[Experiment]:
    """Run the body's requests; on exit every one of them has finished."""
    print(f"\n== {name}: {intro}", flush=True)
    async with trio.open_nursery() as nursery:
        yield Experiment(proxy, nursery)


async def bands(proxy: Proxy, options: argparse.Namespace) -> Played:
    after_id = await proxy.newest_activity_id()
    before = await proxy.metrics()
    async with experiment(
        "bands", proxy, "interactive requests jump a queue of earlier batch requests"
    ) as lab:
        release = await lab.hold_slot(LOADED)
        for n in range(1, 7):
            await lab.send(f"batch-{n}", LOADED, "batch", SHORT_TOKENS)
        lab.say(f"queued 6 batch requests for {LOADED!r} (the loaded model)")
        for n in range(1, 3):
            await lab.send(f"interactive-{n}", OTHER, "interactive", SHORT_TOKENS)
        lab.say(f"queued 2 interactive requests for {OTHER!r} (needs a swap), after them")
        release.set()
        lab.say("hung up on the blocker: the scheduler picks")
    rows = await lab.timeline(after_id)
    after = await proxy.metrics()
    print_table(rows)
    print("  look for: both interactive rows above every batch row, though they paid for a swap")
    late = [row for row in rows if row.band == "interactive"]
    early = [row for row in rows if row.band == "batch"]
    pairs = [(i, b) for i in late for b in early if b.sent.order < i.sent.order]
    overtaken = sum(1 for i, b in pairs if i.start < b.start)
    claims = [
        Claim(
            "bands",
            "interactive requests started before every batch request that arrived earlier",
            bool(pairs) and overtaken == len(pairs),
            f"{overtaken} of {len(pairs)} pairs of an interactive and an earlier batch request",
        )
    ]
    return played("bands", lab, claims, before, after)


async def affinity(proxy: Proxy, options: argparse.Namespace) -> Played:
    after_id = await proxy.newest_activity_id()
    before = await proxy.metrics()
    async with experiment(
        "affinity", proxy, "a newer request for the loaded model goes before a swap"
    ) as lab:
        release = await lab.hold_slot(LOADED)
        await lab.send("older", OTHER, "normal", SHORT_TOKENS)
        await lab.send("newer", LOADED, "normal", SHORT_TOKENS)
        lab.say(f"queued a normal request for {OTHER!r}, then one for {LOADED!r}")
        release.set()
        lab.say("hung up on the blocker: the scheduler picks")
    rows = await lab.timeline(after_id)
    after = await proxy.metrics()
    print_table(rows)
    print(f"  look for: 'newer' ({LOADED}) above 'older' ({OTHER}): it had the affinity bonus (+)")
    in_arrival_order = sorted(rows, key=lambda row: row.sent.order)
    print(
        f"  swaps: {swaps(rows)} in the order served, "
        f"{swaps(in_arrival_order)} had they been served in arrival order"
    )
    row = {r.sent.label: r for r in rows}
    older, newer = row["older"], row["newer"]
    claims = [
        Claim(
            "affinity",
            "the newer request for the loaded model started before the older one needing a swap",
            newer.sent.order > older.sent.order and newer.start < older.start,
            f"newer started at {newer.start:.2f}s, older at {older.start:.2f}s",
        ),
        counter_claim(
            "affinity", "llamaswap_scheduler_affinity_changed_pick_total", before, after
        ),
    ]
    return played("affinity", lab, claims, before, after)


async def aging(proxy: Proxy, options: argparse.Namespace) -> Played:
    after_id = await proxy.newest_activity_id()
    before = await proxy.metrics()
    async with experiment(
        "aging", proxy, "an old batch request outwaits a stream of fresh normal requests"
    ) as lab:
        release = await lab.hold_slot(LOADED)
        await lab.send("batch-old", LOADED, "batch", SHORT_TOKENS)
        fed = 0
        for _ in range(FEEDER_DEPTH):
            fed += 1
            await lab.send(f"normal-{fed}", LOADED, "normal", FEEDER_TOKENS)
        lab.say(f"queued one batch request, then {FEEDER_DEPTH} normal ones, all for {LOADED!r}")
        release.set()
        lab.say(f"hung up on the blocker; keeping {FEEDER_DEPTH} fresh normal requests waiting")
        # Top the queue up whenever the scheduler takes a normal request, until it takes
        # the batch one instead (or the budget runs out: then the claim will say no).
        stop_feeding = trio.current_time() + options.aging_budget
        with trio.move_on_after(options.aging_budget + 120) as guard:
            while depth(metrics := await proxy.metrics(), "batch"):
                if depth(metrics, "normal") < FEEDER_DEPTH and trio.current_time() < stop_feeding:
                    fed += 1
                    await lab.send(f"normal-{fed}", LOADED, "normal", FEEDER_TOKENS)
                else:
                    await trio.sleep(POLL_SECONDS)
        if guard.cancelled_caught:
            raise DemoError("batch-old was never picked, even once the feeding stopped")
        lab.say(f"the scheduler picked batch-old, after {fed} normal requests had been sent")
    rows = await lab.timeline(after_id)
    after = await proxy.metrics()
    print_table(rows)
    print("  look for: batch-old served before the normal requests that arrived after it")
    old = next(row for row in rows if row.sent.label == "batch-old")
    passed = [
        row
        for row in rows
        if row.band == "normal"
        and row.sent.order > old.sent.order
        and row.arrival < old.start < row.start
    ]
    claims = [
        Claim(
            "aging",
            "the old batch request was picked while fresher normal requests were waiting",
            bool(passed),
            f"it waited {old.wait:.1f}s; picked before {', '.join(r.sent.label for r in passed)}"
            if passed
            else f"it waited {old.wait:.1f}s and overtook nobody",
        ),
        counter_claim("aging", "llamaswap_scheduler_aging_changed_pick_total", before, after),
    ]
    return played("aging", lab, claims, before, after)


PLAYS = {"bands": bands, "affinity": affinity, "aging": aging}


# ------------------------------------------------------------------- running it all


async def spawn_proxy(
    nursery: trio.Nursery, config: Path, tail: collections.deque[str]
) -> tuple[trio.Process, str]:
    """Start ``python -m llamaswap`` on ``config``; its URL once it listens.

    Its output goes into ``tail`` (the last lines, shown if something goes wrong).
    Cancellation: cancelling ``nursery`` stops the proxy (SIGTERM, then SIGKILL).
    """
    argv = [sys.executable, "-m", "llamaswap", "--config", str(config), "--listen", "127.0.0.1:0"]
    env = dict(os.environ)
    # config.toml runs its fake servers as `python ...`: make that this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    process: trio.Process = await nursery.start(
        functools.partial(
            trio.run_process,
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
            env=env,
        )
    )
    assert process.stdout is not None
    found: list[str] = []
    listening = trio.Event()

    async def read_output(stream: trio.abc.ReceiveStream) -> None:
        pending = b""
        while chunk := await stream.receive_some():
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                tail.append(text)
                if not found and (match := LISTENING.search(text)):
                    found.append(match["url"])
                    listening.set()
        listening.set()  # the output ended: it will not listen any more

    nursery.start_soon(read_output, process.stdout)
    with trio.move_on_after(30):
        await listening.wait()
    if not found:
        raise DemoError("the proxy did not start:\n" + "\n".join(tail))
    return process, found[0]


def with_start_port(config: Path, port: int, directory: Path) -> Path:
    """A copy of ``config`` whose ``startPort`` is ``port``."""
    text = config.read_text()
    line = f"startPort = {port}"
    text, found = re.subn(r"(?m)^startPort\s*=.*$", line, text)
    if not found:
        text = f"{line}\n{text}"
    copy = directory / config.name
    copy.write_text(text)
    return copy


async def play(url: str, scenarios: Sequence[str], options: argparse.Namespace) -> list[Played]:
    timeout = httpx.Timeout(30.0, read=300.0)
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=10)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        proxy = Proxy(client)
        await proxy.check()
        print(f"proxy: {url}")
        return [await PLAYS[name](proxy, options) for name in scenarios]


async def run(options: argparse.Namespace) -> int:
    scenarios = SCENARIOS if options.scenario == "all" else (options.scenario,)
    if not options.spawn:
        results = await play(options.url, scenarios, options)
    else:
        tail: collections.deque[str] = collections.deque(maxlen=40)
        with tempfile.TemporaryDirectory(prefix="priority-bands-") as directory:
            config = options.config
            if options.start_port is not None:
                config = with_start_port(config, options.start_port, Path(directory))
            async with trio.open_nursery() as nursery:
                process, url = await spawn_proxy(nursery, config, tail)
                try:
                    results = await play(url, scenarios, options)
                except Exception:
                    print("proxy output (last lines):", *tail, sep="\n  ", file=sys.stderr)
                    raise
                finally:
                    with trio.CancelScope(shield=True):
                        process.send_signal(signal.SIGTERM)
                        with trio.move_on_after(30):
                            await process.wait()
                        nursery.cancel_scope.cancel()  # SIGKILL, if it is still there
            if process.returncode != 0:
                raise DemoError(
                    f"the proxy exited with status {process.returncode}:\n" + "\n".join(tail)
                )
            print(f"proxy stopped (exit status {process.returncode})")
    if options.json is not None:
        document = {"scenarios": [result.document() for result in results]}
        options.json.write_text(json.dumps(document, indent=2) + "\n")
    claims = [claim for result in results for claim in result.claims]
    print()
    for claim in claims:
        print(claim.line())
        print(f"  ({claim.detail})")
    return 0 if all(claim.holds for claim in claims) else 1


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    nested = getattr(exc, "exceptions", None)
    if isinstance(nested, tuple):
        return [leaf for inner in nested for leaf in _leaves(inner)]
    return [exc]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the proxy (default {DEFAULT_URL})")
    parser.add_argument(
        "--spawn",
        action="store_true",
        help="start the proxy on a free port for the run, and stop it (SIGTERM) at the end",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        metavar="PATH",
        help="with --spawn: the config to run (default: config.toml next to this script)",
    )
    parser.add_argument(
        "--start-port", type=int, metavar="N", help="with --spawn: the fake servers' first port"
    )
    parser.add_argument(
        "--scenario",
        choices=[*SCENARIOS, "all"],
        default="all",
        help="play one experiment, or all three in turn (the default)",
    )
    parser.add_argument(
        "--aging-budget",
        type=float,
        default=40.0,
        metavar="SECONDS",
        help="how long the aging scenario keeps feeding fresh requests (default 40)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write each scenario's requests, the proxy's records of them and the "
        "counters, as JSON (see README.md)",
    )
    options = parser.parse_args(argv)
    try:
        return trio.run(run, options)
    except BaseException as exc:
        leaves = _leaves(exc)
        if all(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            print("demo: interrupted", file=sys.stderr)
            return 130
        if not all(isinstance(leaf, DemoError) for leaf in leaves):
            raise
        for leaf in leaves:
            print(f"demo: error: {leaf}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
