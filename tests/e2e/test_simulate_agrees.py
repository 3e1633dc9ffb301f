"""``llamaswap simulate`` against the real thing: the same short workload served by the
real proxy and real fake model servers, and by the simulator.

The workload is a burst: eight requests for three models, sent 20 ms apart, all before the
first model has loaded, so the order they are served in is the scheduler's choice alone and
not an accident of timing. The simulator is told the load time the real run measured (a
fake server's load is its ``--load-seconds`` plus Python starting up, which depends on the
machine). Then the two must agree:

* the same service order and the same number of loads, exactly;
* each request's wait within 0.3 s plus 0.15 s for each request served before it (each
  real load and generation varies around its mean by up to about that much, and the
  differences add up along the queue).
"""

from __future__ import annotations

from pathlib import Path

import trio

from llamaswap.config import load_config
from llamaswap.simulate import Run, jobs, loads_workload, policies, run_policy
from tests.benchmarks.bench_scheduling import real_run, with_load_time
from tests.e2e.harness import REPO

CONFIG = REPO / "examples" / "workloads" / "config.toml"

BURST = [
    ("a", "normal"),
    ("b", "batch"),
    ("c", "interactive"),
    ("a", "batch"),
    ("b", "normal"),
    ("c", "normal"),
    ("a", "interactive"),
    ("b", "interactive"),
]
WORKLOAD = "\n".join(
    f'[[requests]]\nat = {i * 0.02:.2f}\nmodel = "{model}"\npriority = "{priority}"\njob = 0.3'
    for i, (model, priority) in enumerate(BURST)
)


def service_order(run: Run) -> list[int]:
    started = [o for o in run.outcomes if o.started is not None]
    return [o.job.index for o in sorted(started, key=lambda o: o.started or 0.0)]


async def test_the_simulator_and_the_real_proxy_serve_a_burst_alike(tmp_path: Path) -> None:
    config = load_config(CONFIG)
    workload = loads_workload(WORKLOAD, config)
    [own] = policies(config)
    with trio.fail_after(60):
        real = await real_run(CONFIG.read_text(), own, jobs(workload), tmp_path)
    assert real.load_seconds > 0
    simulated = await trio.to_thread.run_sync(
        run_policy, own, config, with_load_time(workload, config, real.load_seconds)
    )
    # serial: a starts loading for #0; then by score (interactive 100, affinity +10 for the
    # loaded model, ties to the earlier arrival): #6 (a), #2 (c), #7 (b), #4 (b), #5 (c),
    # #1 (b), #3 (a).
    assert service_order(simulated) == [0, 6, 2, 7, 4, 5, 1, 3]
    assert service_order(real.run) == service_order(simulated)
    assert real.run.loads == simulated.loads == 6
    position = {index: n for n, index in enumerate(service_order(simulated))}
    for s, r in zip(simulated.outcomes, real.run.outcomes, strict=True):
        assert s.wait is not None
        assert r.wait is not None
        bound = 0.3 + 0.15 * position[s.job.index]
        assert abs(r.wait - s.wait) <= bound, (s.job, r.wait, s.wait)
