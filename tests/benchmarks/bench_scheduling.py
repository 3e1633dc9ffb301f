"""Scheduling policies compared through the real proxy, beside ``llamaswap simulate``.

    python tests/benchmarks/bench_scheduling.py [--config examples/workloads/config.toml] \\
        [--workload examples/workloads/mixed.workload.toml] \\
        [--duration 120] [--plot docs/img/scheduling.png]

For each policy (the config's own, arrival order, strict priority, fifo, and the config's
own with ``preempt`` on: ``serial + preempt``) it starts the
real proxy with the policy written into its config, which starts real fake model servers
(``--load-seconds``, ``--tokens-per-second``, ``--parallel 1``), and replays the
workload's arrivals in real time: each request is a streamed chat completion whose
``max_tokens`` makes it last its job time, sent with its priority header. A request's
wait is from sending it to its response headers, which the fake server sends when it
starts generating (the moment ``llamaswap simulate`` calls ``started``). Then it runs the
simulator on the same arrivals and prints both tables, the goals of issues 12 and 29, and
whether each holds, in the real run and in the simulated one. A preempted request is
resumed by the proxy as for any client (the fake server continues a prefilled answer);
the real run's preemptions and recomputed prompt tokens are read from ``/api/activity``.

The real run takes ``--duration`` seconds per policy (the workload's own duration is
replaced by it), so the default takes about ten minutes.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs
import httpx
import tomlkit
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llamaswap.config import Config, load_config
from llamaswap.simulate import (
    Figures,
    Job,
    Outcome,
    Policy,
    PreemptionFigures,
    Run,
    Workload,
    figures,
    jobs,
    load_workload,
    plot,
    policies,
    run_policy,
    table,
)
from tests.e2e.harness import free_port_base, start_proxy, stop_proxy

REPO = Path(__file__).resolve().parents[2]
TOKENS_PER_SECOND = 100  # the example config's fake servers write this many a second
PRIORITY = "X-LlamaSwap-Priority"


def policy_toml(text: str, policy: Policy, start_port: int) -> str:
    """The config file ``text`` with ``policy`` written into it, as a user would."""
    doc = tomlkit.parse(text)
    doc["startPort"] = start_port
    if policy.min_residency is not None:
        doc["minResidency"] = policy.min_residency
    routing = doc.setdefault("routing", tomlkit.table())
    scheduler = routing.setdefault("scheduler", tomlkit.table())
    if policy.use is not None:
        scheduler["use"] = policy.use
    if policy.serial:
        settings = scheduler.setdefault("settings", tomlkit.table())
        serial = settings.setdefault("serial", tomlkit.table())
        for key, value in policy.serial.items():
            serial[key] = value
    return tomlkit.dumps(doc)


def max_tokens(job: Job) -> int:
    return max(1, round(job.duration * TOKENS_PER_SECOND))


async def replay(url: str, arrivals: Sequence[Job], *, ignore_priority: bool) -> list[Outcome]:
    """Send each job at its time; when its answer starts and ends, or its error status."""
    outcomes = [Outcome(job) for job in arrivals]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        start = trio.current_time()

        async def one(job: Job) -> None:
            body = {
                "model": job.model,
                "stream": True,
                "max_tokens": max_tokens(job),
                "messages": [{"role": "user", "content": f"job {job.index}"}],
            }
            headers = {} if ignore_priority else {PRIORITY: str(job.priority)}
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                started = trio.current_time() - start
                await response.aread()
            if response.status_code != 200:
                outcomes[job.index] = Outcome(job, error=str(response.status_code))
            else:
                outcomes[job.index] = Outcome(job, started, trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            for job in arrivals:
                await trio.sleep_until(start + job.at)
                nursery.start_soon(one, job)
    return outcomes


def metric_sum(text: str, prefix: str, having: str = "") -> float:
    """The sum of the ``/metrics`` samples whose line starts with ``prefix``."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and having in line
    )


def preemption_figures(
    records: Sequence[dict[str, object]], outcomes: Sequence[Outcome]
) -> PreemptionFigures:
    """What preemption cost in a real run: the preemptions and recomputed prompt tokens
    the forwarder wrote down in the activity records, and the tokens generated, every
    served request's ``max_tokens`` (the fake server generates exactly that many; the
    streamed answers have no ``usage``). The fake server reads a prompt in no time:
    ``recompute_seconds`` is 0."""

    def number(value: object) -> int:
        return value if isinstance(value, int) else 0

    def meta(record: dict[str, object], key: str) -> int:
        metadata = record.get("metadata")
        return number(metadata.get(key)) if isinstance(metadata, dict) else 0

    return PreemptionFigures(
        preemptions=sum(meta(r, "preemptions") for r in records),
        generated_tokens=sum(max_tokens(o.job) for o in outcomes if o.finished is not None),
        recomputed_tokens=sum(meta(r, "recomputed_prompt_tokens") for r in records),
        recompute_seconds=0.0,
    )


def preempts(config: Config) -> bool:
    scheduler = config.routing.scheduler
    return scheduler.use == "serial" and scheduler.settings.serial.preempt


@attrs.frozen
class RealRun:
    run: Run
    #: The mean time from a model's start to ready, as the proxy measured it.
    load_seconds: float


async def real_run(
    config_text: str,
    policy: Policy,
    arrivals: Sequence[Job],
    directory: Path,
    preempting: bool = False,
) -> RealRun:
    """``arrivals`` served by the real proxy under ``policy`` (which preempts, if
    ``preempting``: its activity is read for the figures)."""
    text = policy_toml(config_text, policy, free_port_base(16))
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, text, directory, log_level="warn")
        try:
            outcomes = await replay(proxy.url, arrivals, ignore_priority=policy.ignore_priority)
            async with proxy.client() as client:
                metrics = (await client.get("/metrics")).text
                activity = (await client.get("/api/activity?limit=10000")).json()["activity"]
        finally:
            await stop_proxy(proxy)
        nursery.cancel_scope.cancel()
    loads = metric_sum(metrics, "llamaswap_model_loads_total{", 'result="ready"')
    seconds = metric_sum(metrics, "llamaswap_model_load_duration_seconds_sum")
    preemption = preemption_figures(activity, outcomes) if preempting else None
    run = Run(tuple(outcomes), round(loads), None, None, preemption=preemption)
    return RealRun(run, seconds / loads if loads else 0.0)


def with_load_time(workload: Workload, config: Config, seconds: float) -> Workload:
    """``workload`` with the load of every model of ``config`` taking ``seconds``."""
    models = {m: attrs.evolve(workload.server(m), load=seconds) for m in config.models}
    return attrs.evolve(workload, models=models)


def simulated_runs(config: Config, workload: Workload) -> list[tuple[str, Run]]:
    return [(p.name, run_policy(p, config, workload)) for p in policies(config, compare=True)]


def real_runs(config_path: Path, config: Config, workload: Workload) -> list[RealRun]:
    arrivals = jobs(workload)
    text = config_path.read_text()
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        for policy in policies(config, compare=True):
            print(f"real run: {policy.name} ({len(arrivals)} requests) ...", flush=True)
            preempting = preempts(policy.applied(config))
            runs.append(trio.run(real_run, text, policy, arrivals, Path(directory), preempting))
    return runs


def goals(rows: Sequence[Figures]) -> list[tuple[str, bool | None]]:
    """Issue 12's goals for the serial scheduler, checked on one table's rows."""
    own, arrival, strict = rows[0], rows[1], rows[2]

    def ratio(a: float | None, b: float | None) -> float:
        return math.nan if a is None or b is None or b == 0 else a / b

    speedup = ratio(arrival.interactive_p95, own.interactive_p95)
    return [
        (f"interactive p95 >= 10x better than arrival order ({speedup:.1f}x)", speedup >= 10),
        (
            "interactive p95 no worse than strict priority",
            None
            if own.interactive_p95 is None or strict.interactive_p95 is None
            else own.interactive_p95 <= strict.interactive_p95,
        ),
        (
            "batch max wait <= 1.5x arrival order's "
            f"({ratio(own.batch_max, arrival.batch_max):.2f}x)",
            ratio(own.batch_max, arrival.batch_max) <= 1.5,
        ),
        ("loads no more than strict priority's", own.loads <= strict.loads),
    ]


def preemption_goals(rows: Sequence[Figures]) -> list[tuple[str, bool | None]]:
    """Issue 29's goals for ``serial + preempt``, checked on one table's rows."""
    by_name = {row.policy: row for row in rows}
    arrival, strict = by_name["arrival order"], by_name["strict priority"]
    preempt = by_name.get("serial + preempt")
    if preempt is None or preempt.preemption is None:
        return [("serial + preempt was not run (the config preempts already?)", None)]

    def ratio(a: float | None, b: float | None) -> float:
        return math.nan if a is None or b is None or b == 0 else a / b

    p95 = ratio(preempt.interactive_p95, strict.interactive_p95)
    batch = ratio(preempt.batch_max, arrival.batch_max)
    found = preempt.preemption
    return [
        (f"interactive p95 <= 0.5x strict priority's ({p95:.2f}x)", p95 <= 0.5),
        (f"batch max wait <= 1.5x arrival order's ({batch:.2f}x)", batch <= 1.5),
        (
            f"recomputed tokens <= 10 % of generated ({found.recomputed_tokens} of "
            f"{found.generated_tokens}: {100 * found.recomputed_fraction:.1f} %, "
            f"{found.preemptions} preemptions)",
            found.recomputed_fraction <= 0.1,
        ),
    ]


def agreement(simulated: Run, real: Run) -> str:
    """How far apart the two runs' waits are, request by request."""
    gaps = [
        abs(s.wait - r.wait)
        for s, r in zip(simulated.outcomes, real.outcomes, strict=True)
        if s.wait is not None and r.wait is not None
    ]
    if not gaps:
        return "no request served in both"
    gaps.sort()
    return f"|real - simulated| wait: p50 {gaps[len(gaps) // 2]:.2f} s, max {gaps[-1]:.2f} s"


def print_goals(title: str, rows: Sequence[Figures]) -> None:
    print(f"\n{title}")
    for text, held in goals(rows) + preemption_goals(rows):
        mark = "n/a" if held is None else ("yes" if held else "NO")
        print(f"  [{mark:>3}] {text}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "examples/workloads/config.toml")
    parser.add_argument("--workload", default=str(REPO / "examples/workloads/mixed.workload.toml"))
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per policy")
    parser.add_argument("--plot", help="draw the real run's waits to this PNG")
    options = parser.parse_args(argv)
    config = load_config(options.config)
    workload = attrs.evolve(load_workload(options.workload, config), duration=options.duration)

    simulated = simulated_runs(config, workload)
    reals = real_runs(options.config, config, workload)
    real = [(name, r.run) for (name, _), r in zip(simulated, reals, strict=True)]
    measured = sum(r.load_seconds for r in reals) / len(reals)
    resimulated = simulated_runs(config, with_load_time(workload, config, measured))
    print(f"\n{len(jobs(workload))} requests over {workload.duration:.0f} s, per policy\n")
    print("simulated (llamaswap simulate, the workload's load times):")
    print(table([figures(name, run) for name, run in simulated]))
    print(f"\nsimulated with the load time the real runs measured ({measured:.2f} s):")
    resimulated_rows = [figures(name, run) for name, run in resimulated]
    print(table(resimulated_rows))
    print("\nreal (the proxy and fake model servers, real time):")
    real_rows = [figures(name, run) for name, run in real]
    print(table(real_rows))
    print("\nagreement with the simulation at the measured load time, per policy:")
    for (name, s), (_, r) in zip(resimulated, real, strict=True):
        print(f"  {name}: {agreement(s, r)}")
    print_goals("goals (real run):", real_rows)
    print_goals("goals (simulated at the measured load time):", resimulated_rows)
    if options.plot:
        plot(real, options.plot)
        print(f"\nplot of the real run: {options.plot}")


if __name__ == "__main__":
    main()
