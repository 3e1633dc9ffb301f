"""examples/priority-bands/demo.py, run as a person would (with --spawn), judged by its data.

The demo starts a real proxy on its config, with real fake model servers and the real
clock, and plays its three scenarios. With ``--json`` it also writes what it sent and the
proxy's activity record of each request. This test reads the timeline from those records
(arrival, queue wait, duration, priority, model) and checks the effects itself, so a demo
that computed its ``CLAIM`` lines wrongly could not pass it.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
import signal
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.e2e.harness import REPO, child_env, free_port_base, survivors, wait_until

DEMO = REPO / "examples" / "priority-bands" / "demo.py"
#: SPEC §7.2: the header's words as numbers.
PRIORITIES = {"interactive": 100, "normal": 0, "batch": -100}
#: The clocks behind a record's times: arrival is wall-clock milliseconds, waits and
#: durations are monotonic; two requests' times may disagree by this much.
SLACK = 0.05


@dataclasses.dataclass(frozen=True)
class Request:
    """One request of a scenario: what the demo sent, and when the proxy says it ran."""

    label: str
    model: str
    order: int  # arrival rank: the demo sent it once the proxy had admitted the previous
    priority: int
    band: str
    affinity: bool
    arrival: float  # seconds since the epoch
    dispatched: float
    finished: float


def timeline(scenario: Mapping[str, Any]) -> list[Request]:
    """The scenario's requests in arrival order, checked against what the demo sent."""
    requests = []
    for sent in scenario["requests"]:
        record = sent["activity"]
        where = f"{scenario['scenario']}: {sent['label']}: {record}"
        assert record["model"] == sent["model"], where
        assert record["priority"] == PRIORITIES[sent["priority_header"]], where
        assert (record["scheduler"], record["status"]) == ("serial", 200), where
        arrival = datetime.datetime.fromisoformat(record["time"].replace("Z", "+00:00"))
        at = arrival.timestamp()
        requests.append(
            Request(
                label=sent["label"],
                model=sent["model"],
                order=sent["order"],
                priority=record["priority"],
                band=record["band"],
                affinity=bool(record["metadata"].get("affinity", False)),
                arrival=at,
                dispatched=at + record["queue_wait_ms"] / 1000,
                finished=at + record["duration_ms"] / 1000,
            )
        )
    assert [r.order for r in requests] == list(range(len(requests))), scenario
    arrivals = [r.arrival for r in requests]
    assert arrivals == sorted(arrivals), f"{scenario['scenario']}: arrivals out of order"
    # SPEC §7.5: one slot, so no two requests are ever in service at once.
    served = sorted(requests, key=lambda r: r.dispatched)
    for before, after in itertools.pairwise(served):
        assert after.dispatched >= before.finished - SLACK, (before, after)
    return requests


def dispatch_order(requests: Iterable[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: r.dispatched)


def swaps(requests: Sequence[Request]) -> int:
    return sum(1 for a, b in itertools.pairwise(requests) if a.model != b.model)


def went_up(scenario: Mapping[str, Any], counter: str) -> bool:
    counters = scenario["counters"]
    return bool(counters["after"][counter] > counters["before"][counter])


def check_bands(requests: list[Request]) -> None:
    """Interactive work is dispatched before batch work that was queued earlier, although
    the batch work's model was loaded and the interactive work needed a swap."""
    loaded = requests[0].model  # the blocker's
    interactive = [r for r in requests if r.band == "interactive"]
    batch = [r for r in requests if r.band == "batch"]
    assert interactive, requests
    assert batch, requests
    assert all(r.model != loaded for r in interactive), requests
    assert all(r.model == loaded for r in batch), requests
    pairs = [(i, b) for i in interactive for b in batch if b.order < i.order]
    assert len(pairs) == len(interactive) * len(batch), "every batch request came first"
    for late, early in pairs:
        assert late.dispatched < early.dispatched, (late, early)


def check_affinity(scenario: Mapping[str, Any], requests: list[Request]) -> None:
    """Of two equal-priority requests, the newer one for the loaded model goes first,
    which saves a swap."""
    loaded = requests[0].model
    by_label = {r.label: r for r in requests}
    older, newer = by_label["older"], by_label["newer"]
    assert older.priority == newer.priority, requests
    assert older.order < newer.order, requests
    assert older.model != loaded, requests
    assert newer.model == loaded, requests
    assert newer.dispatched < older.dispatched, (newer, older)
    assert newer.affinity, newer
    assert not older.affinity, older
    served = dispatch_order(requests)
    assert swaps(served) < swaps(requests), [r.label for r in served]
    assert went_up(scenario, "llamaswap_scheduler_affinity_changed_pick_total"), scenario


def check_aging(scenario: Mapping[str, Any], requests: list[Request]) -> None:
    """An old batch request is dispatched ahead of newer requests of a higher priority
    that were already waiting: aging, not priority, picked it."""
    (old,) = [r for r in requests if r.band == "batch"]
    overtaken = [
        r
        for r in requests
        if r.order > old.order
        and r.priority > old.priority
        and r.arrival < old.dispatched < r.dispatched
    ]
    assert overtaken, [(r.label, r.arrival, r.dispatched) for r in requests]
    assert went_up(scenario, "llamaswap_scheduler_aging_changed_pick_total"), scenario


async def _interrupt_then_kill(process: trio.Process) -> None:
    """On a hang: Ctrl-C the demo (it stops its proxy), then kill whatever is left."""
    process.send_signal(signal.SIGINT)
    with trio.move_on_after(30):
        await process.wait()
        return
    os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
async def test_priority_bands_demo_timeline_shows_every_effect(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    data = tmp_path / "timeline.json"
    argv = [sys.executable, str(DEMO), "--spawn", "--start-port", str(free_port_base())]
    argv += ["--json", str(data)]
    with trio.fail_after(240):
        result = await trio.run_process(
            argv,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=REPO,
            env=child_env(marker),
            start_new_session=True,
            deliver_cancel=_interrupt_then_kill,
        )
    # The demo stopped its proxy, and the proxy its model servers.
    await wait_until(lambda: not survivors(marker), within=10)
    output = result.stdout.decode()
    report = f"stdout:\n{output}\nstderr:\n{result.stderr.decode()}"
    assert result.returncode == 0, report
    assert "proxy stopped (exit status 0)" in output, report

    scenarios = {s["scenario"]: s for s in json.loads(data.read_text())["scenarios"]}
    assert set(scenarios) == {"bands", "affinity", "aging"}, report
    requests = {name: timeline(scenario) for name, scenario in scenarios.items()}
    check_bands(requests["bands"])
    check_affinity(scenarios["affinity"], requests["affinity"])
    check_aging(scenarios["aging"], requests["aging"])

    # The people's version is still printed: a timeline row for every request.
    for request in itertools.chain.from_iterable(requests.values()):
        assert f"\n  {request.label} " in output, report
