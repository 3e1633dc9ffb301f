"""Seeded chaos traffic against a real proxy, and a record of everything it saw.

``Chaos.run`` drives a proxy started by ``tests.e2e.harness.start_proxy`` with concurrent
clients (random models, priorities -- garbage included --, streaming or not, hanging up at a
random moment) while two more tasks unload models and SIGKILL model servers. Each task
draws from its own ``random.Random``, seeded in a fixed order from the soak's seed, so a
seed names the same plan of requests and disturbances on every run (the proxy's timing,
and so the interleaving, is the real machine's).

Nothing here judges the proxy: every request ends as an ``Outcome`` (answered, abandoned
on purpose, or hung), every unload and kill as a ``Disturbance`` with its time, and the
soak's assertions read those.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Literal, final

import httpx
import trio

from tests.e2e.harness import ProxyProcess, survivors

CHAT = "/v1/chat/completions"
PRIORITY = b"X-LlamaSwap-Priority"
Kind = Literal["chat", "stream", "load"]
KINDS: tuple[Kind, ...] = ("chat", "stream", "load")
#: Longer than any legitimate wait in the soak (a request may queue behind all the others,
#: with the lowest priority, until traffic stops), short enough to fail a hang in time.
HANG_SECONDS = 60.0

#: What a client may send as ``X-LlamaSwap-Priority``: each entry is the header's values
#: in order (none: no header). Well-formed, garbage, out of range, and not even ASCII.
#: (No surrounding whitespace: HTTP strips it before the proxy could see it.)
PRIORITY_HEADERS: tuple[tuple[bytes, ...], ...] = (
    (),
    (b"interactive",),
    (b"normal",),
    (b"batch",),
    (b"INTERACTIVE",),
    (b"bAtCh",),
    (b"+25",),
    (b"-7",),
    (b"49",),
    (b"50",),
    (b"-51",),
    (b"100000",),
    (b"-100000",),
    (b"9" * 4000,),
    (b"9" * 4001,),
    (b"",),
    (b"urgent",),
    (b"1e3",),
    (b"0x10",),
    (b"--5",),
    (b"+",),
    (b"interactive, batch",),
    ("\uff11\uff12".encode(),),  # fullwidth digits: int() would take them, SPEC does not
    ("h\xf6chste".encode("latin-1"),),
    (b"batch", b"interactive"),  # the first occurrence counts
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One request, decided in advance from the seed."""

    kind: Kind
    model: str
    priority: tuple[bytes, ...]
    max_tokens: int
    #: Hang up this many seconds after sending (while queued, loading or served).
    abandon_after: float | None
    #: Hang up after this many streamed chunks (mid-stream).
    abandon_at_chunk: int | None
    #: Think time before sending.
    pause: float

    def describe(self) -> str:
        leave = ""
        if self.abandon_after is not None:
            leave = f", hang up after {self.abandon_after:.3f}s"
        if self.abandon_at_chunk is not None:
            leave = f", hang up after {self.abandon_at_chunk} chunks"
        shown = [v if len(v) < 20 else v[:8] + b"..." for v in self.priority]
        return f"{self.kind} {self.model!r} priority={shown} max_tokens={self.max_tokens}{leave}"


@dataclasses.dataclass
class Outcome:
    """How one request ended, from the client's side; times are ``trio.current_time()``."""

    worker: int
    number: int
    plan: Plan
    sent: float
    ended: float = 0.0
    status: int | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The error object of a non-200 body, or of an error event that ended a stream.
    error: Any = None
    #: A body that is not what its status promises (not JSON, wrong shape...).
    malformed: str | None = None
    #: A streamed answer that ended with ``data: [DONE]``.
    done: bool = False
    #: The ``model`` a 200 answer (or its first chunk) named.
    answered_by: str | None = None
    abandoned: bool = False
    hung: bool = False
    transport_error: str | None = None

    def describe(self) -> str:
        how = f"status {self.status}"
        if self.error is not None:
            how += f" error {json.dumps(self.error)[:300]}"
        if self.malformed:
            how += f" malformed: {self.malformed}"
        if self.transport_error:
            how += f" transport error: {self.transport_error}"
        if self.abandoned:
            how += " (abandoned)"
        if self.hung:
            how += " (HUNG)"
        return (
            f"worker {self.worker} request {self.number} [{self.plan.describe()}] "
            f"sent at {self.sent:.2f}s, ended at {self.ended:.2f}s: {how}"
        )


#: How long after a SIGKILL a request may still feel it: the proxy notices the death at
#: once, but a request granted just before may only now reach the dead server.
KILL_AFTERMATH = 3.0
#: How long after an unload returned (its models stopped) a request may still feel it:
#: the client hears of a failure about when the unloader hears of the unload's end.
UNLOAD_AFTERMATH = 0.5


@dataclasses.dataclass(frozen=True)
class Disturbance:
    """Something the soak did to the models: an unload, or a SIGKILL of a model server.

    A request for one of ``models`` that overlaps ``[start, end]`` may fail because of it.
    """

    what: str
    models: frozenset[str]
    start: float
    end: float


@final
class Chaos:
    """The soak's traffic; see the module docstring.

    Args:
        proxy: the proxy under test.
        seed: drives every choice.
        models: model ID → weight when clients pick a model.
        start_seconds: when the experiment began (``trio.current_time()``), for times.
    """

    def __init__(self, proxy: ProxyProcess, seed: int, models: Mapping[str, int]) -> None:
        self.proxy = proxy
        self.seed = seed
        self._rng = random.Random(seed)
        self._models = list(models)
        self._weights = list(models.values())
        self.outcomes: list[Outcome] = []
        self.disturbances: list[Disturbance] = []
        #: Problems seen by the chaos tasks themselves (an unload that failed...).
        self.problems: list[str] = []
        self.origin = trio.current_time()

    def now(self) -> float:
        return trio.current_time() - self.origin

    def client(self) -> httpx.AsyncClient:
        # No timeout of httpx's: every request runs under its own hang guard instead.
        return httpx.AsyncClient(base_url=self.proxy.url, timeout=None, trust_env=False)

    async def run(
        self,
        *,
        workers: int,
        requests_per_worker: int,
        seconds: float,
        unload_every: tuple[float, float] = (1.0, 3.0),
        kill_every: tuple[float, float] = (1.0, 3.0),
    ) -> None:
        """Send traffic for ``seconds`` (at most ``requests_per_worker`` per client).

        Returns once every request has ended (each is bounded by ``HANG_SECONDS``).
        """
        deadline = trio.current_time() + seconds
        # One generator per task, seeded in a fixed order: the plan does not depend on
        # how the tasks interleave.
        seeds = [self._rng.getrandbits(64) for _ in range(workers + 2)]
        async with trio.open_nursery() as nursery:
            for worker in range(workers):
                rng = random.Random(seeds[worker])
                nursery.start_soon(self._worker, worker, rng, deadline, requests_per_worker)
            unloader, killer = (random.Random(seed) for seed in seeds[workers:])
            nursery.start_soon(self._unloader, unloader, deadline, unload_every)
            nursery.start_soon(self._killer, killer, deadline, kill_every)

    # ------------------------------------------------------------------ clients

    def plan(self, rng: random.Random) -> Plan:
        kind = rng.choices(KINDS, weights=(45, 45, 10))[0]
        model = rng.choices(self._models, weights=self._weights)[0]
        leave = rng.random()
        abandon_after = abandon_at_chunk = None
        if kind == "stream" and leave < 0.2:
            abandon_at_chunk = rng.randint(1, 6)
        elif leave < 0.45:
            abandon_after = rng.uniform(0.0, 0.8)
        return Plan(
            kind=kind,
            model=model,
            priority=rng.choice(PRIORITY_HEADERS),
            max_tokens=rng.randint(2, 10),
            abandon_after=abandon_after,
            abandon_at_chunk=abandon_at_chunk,
            pause=rng.choice((0.0, 0.0, rng.uniform(0.0, 0.2))),
        )

    async def _worker(self, worker: int, rng: random.Random, deadline: float, count: int) -> None:
        async with self.client() as client:
            for number in range(count):
                if trio.current_time() >= deadline:
                    return
                plan = self.plan(rng)
                await trio.sleep(plan.pause)  # chaos input: when the next request arrives
                outcome = Outcome(worker, number, plan, sent=self.now())
                self.outcomes.append(outcome)
                await self.request(client, outcome)

    async def request(self, client: httpx.AsyncClient, outcome: Outcome) -> None:
        """Send ``outcome.plan``; record how it ended. Never raises (but Cancelled)."""
        plan = outcome.plan
        abandon = trio.CancelScope()
        if plan.abandon_after is not None:
            abandon.deadline = trio.current_time() + plan.abandon_after
        hang = trio.CancelScope(deadline=trio.current_time() + HANG_SECONDS)
        headers = [(PRIORITY, value) for value in plan.priority]
        with abandon, hang:
            try:
                if plan.kind == "stream":
                    await self._stream(client, outcome, headers, abandon)
                elif plan.kind == "chat":
                    body = _chat(outcome, stream=False)
                    response = await client.post(CHAT, json=body, headers=headers)
                    self._answer(outcome, response)
                else:
                    path = f"/api/models/load/{plan.model}"
                    self._answer(outcome, await client.post(path, headers=headers))
            except httpx.TransportError as exc:
                outcome.transport_error = repr(exc)
        outcome.ended = self.now()
        # Called, not caught: a hang-up after the last chunk may find nothing left to cancel.
        outcome.abandoned = abandon.cancel_called
        outcome.hung = hang.cancelled_caught

    def _answer(self, outcome: Outcome, response: httpx.Response) -> None:
        outcome.status = response.status_code
        outcome.headers = dict(response.headers)
        try:
            document = response.json()
        except ValueError:
            outcome.malformed = f"not JSON: {response.text[:200]!r}"
            return
        if response.status_code == 200:
            if not isinstance(document, dict):
                outcome.malformed = f"not an object: {document!r:.200}"
                return
            outcome.answered_by = document.get("model")
            if outcome.plan.kind == "chat" and not document.get("choices"):
                outcome.malformed = f"no choices: {document!r:.200}"
        else:
            outcome.error = _error_object(document)
            if outcome.error is None:
                outcome.malformed = f"not an error body: {document!r:.200}"

    async def _stream(
        self,
        client: httpx.AsyncClient,
        outcome: Outcome,
        headers: Sequence[tuple[bytes, bytes]],
        abandon: trio.CancelScope,
    ) -> None:
        body = _chat(outcome, stream=True)
        async with client.stream("POST", CHAT, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                self._answer(outcome, response)
                return
            outcome.status = 200
            outcome.headers = dict(response.headers)
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                outcome.malformed = f"content-type {response.headers.get('content-type')!r}"
            chunks = 0
            # Read to the end, never `break`: a hang-up is a cancellation raised from the
            # next read, which finishes httpx's nested async generators with it (breaking
            # out would leave them to the garbage collector, and Trio warns about that).
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or abandon.cancel_called:
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    outcome.done = True
                    continue
                try:
                    event = json.loads(data)
                except ValueError:
                    outcome.malformed = f"event not JSON: {data[:200]!r}"
                    continue
                if isinstance(event, dict) and "error" in event:
                    outcome.error = _error_object(event)
                    if outcome.error is None:
                        outcome.malformed = f"not an error event: {data[:200]!r}"
                    continue
                if chunks == 0 and isinstance(event, dict):
                    outcome.answered_by = event.get("model")
                chunks += 1
                if chunks == outcome.plan.abandon_at_chunk:
                    abandon.cancel()

    # ---------------------------------------------------------------- chaos tasks

    async def _unloader(
        self, rng: random.Random, deadline: float, every: tuple[float, float]
    ) -> None:
        async with self.client() as client:
            while trio.current_time() + every[0] < deadline:
                await trio.sleep(rng.uniform(*every))  # chaos input: when to unload
                everything = rng.random() < 0.25
                model = rng.choice(self._models)
                path = "/api/models/unload" if everything else f"/api/models/unload/{model}"
                start = self.now()
                response = await self._call(client, "POST", path)
                models = frozenset(self._models if everything else [model])
                if everything and response is not None and response.status_code == 200:
                    # The models it stopped: requests for the others stay queued.
                    models = frozenset(response.json()["unloaded"])
                end = self.now() + UNLOAD_AFTERMATH
                self.disturbances.append(Disturbance(f"POST {path}", models, start, end))
                if response is not None and response.status_code != 200:
                    self.problems.append(
                        f"POST {path} at {start:.2f}s: {response.status_code} {response.text}"
                    )

    async def _killer(
        self, rng: random.Random, deadline: float, every: tuple[float, float]
    ) -> None:
        async with self.client() as client:
            while trio.current_time() + every[0] < deadline:
                await trio.sleep(rng.uniform(*every))  # chaos input: when to crash a model
                response = await self._call(client, "GET", "/running")
                if response is None:
                    continue
                ours = set(survivors(self.proxy.marker))
                running = [
                    entry
                    for entry in response.json()["running"]
                    if isinstance(entry.get("pid"), int) and entry["pid"] in ours
                ]
                if not running:
                    continue
                victim = rng.choice(sorted(running, key=lambda entry: str(entry["model"])))
                try:
                    os.kill(victim["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    continue
                at = self.now()
                what = f"SIGKILL {victim['model']!r} (pid {victim['pid']}, {victim['state']})"
                models = frozenset([victim["model"]])
                self.disturbances.append(Disturbance(what, models, at, at + KILL_AFTERMATH))

    async def _call(
        self, client: httpx.AsyncClient, method: str, path: str
    ) -> httpx.Response | None:
        """A chaos task's own request; a hang or a broken connection is a problem."""
        start = self.now()
        with trio.move_on_after(HANG_SECONDS):
            try:
                return await client.request(method, path)
            except httpx.TransportError as exc:
                self.problems.append(f"{method} {path} at {start:.2f}s: {exc!r}")
                return None
        self.problems.append(f"{method} {path} at {start:.2f}s never returned")
        return None


def _chat(outcome: Outcome, *, stream: bool) -> dict[str, object]:
    return {
        "model": outcome.plan.model,
        "messages": [{"role": "user", "content": f"soak {outcome.worker}.{outcome.number}"}],
        "max_tokens": outcome.plan.max_tokens,
        "stream": stream,
    }


def _error_object(document: object) -> dict[str, Any] | None:
    """``document["error"]`` if it has the proxy's shape (SPEC §4.3), else None."""
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    if not isinstance(error, dict):
        return None
    if not all(isinstance(error.get(key), str) for key in ("message", "type", "code")):
        return None
    if "param" not in error:
        return None
    return error
