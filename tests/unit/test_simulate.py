"""``llamaswap simulate``: workloads, and the real scheduler run on them in simulated time."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from llamaswap.config import Config, loads_config
from llamaswap.errors import ConfigError
from llamaswap.process.supervisor import HEALTH_POLL_INTERVAL
from llamaswap.simulate import (
    Budget,
    MemoryFigures,
    PreemptionFigures,
    Run,
    budget_problem,
    figures,
    jobs,
    load_workload,
    loads_workload,
    parse_budget,
    policies,
    run_policy,
    table,
    unfit,
)
from tests.unit.ports import every_port_free

CONFIG = """
[models.a]
cmd = "server ${PORT}"
aliases = ["alpha"]
[models.b]
cmd = "server ${PORT}"
[routing.scheduler]
use = "serial"
"""


def config(text: str = CONFIG) -> Config:
    return loads_config(
        textwrap.dedent(text), file="config.toml", environ={}, free=every_port_free
    )


def workload_text(text: str) -> str:
    return textwrap.dedent(text)


# ------------------------------------------------------------------- the workload file


def test_a_bad_workload_reports_every_problem_at_its_key_path() -> None:
    text = workload_text(
        """
        seed = -1
        [models.zeta]
        load = "soon"
        [[streams]]
        model = "a"
        every = 0
        job = "1s"
        [[requests]]
        at = "1s"
        model = "nope"
        job = "1s"
        colour = "red"
        """
    )
    with pytest.raises(ConfigError) as caught:
        loads_workload(text, config(), file="w.toml")
    assert [(p.path, p.message.split(";")[0]) for p in caught.value.problems] == [
        ("seed", "expected a seed from 0 to 1000000000, got -1"),
        (
            "models.zeta.load",
            "expected a number of seconds or a duration like \"90s\", got 'soon'",
        ),
        (
            "streams[0].every",
            "expected a duration from 0.001 to 31536000 seconds (1 year), got 0 seconds",
        ),
        ("requests[0].colour", "unknown key 'colour'"),
        # Names are checked as written, so they are told with what cannot be read.
        ("models.zeta", "no model 'zeta' in the config"),
        ("requests[0].model", "no model 'nope' in the config"),
    ]


def test_names_resolve_to_model_ids_and_unknown_ones_are_problems() -> None:
    text = workload_text(
        """
        duration = "1m"
        [models.alpha]
        load = "2s"
        [[streams]]
        model = "alpha"
        every = "10s"
        job = "1s"
        [[requests]]
        at = 0
        model = "nope"
        job = "1s"
        """
    )
    with pytest.raises(ConfigError) as caught:
        loads_workload(text, config(), file="w.toml")
    [problem] = caught.value.problems
    assert problem.path == "requests[0].model"
    assert "no model 'nope'" in problem.message
    fixed = loads_workload(text.replace('"nope"', '"b"'), config())
    assert fixed.server("a").load == 2.0
    assert [s.model for s in fixed.streams] == ["a"]


def test_streams_need_a_duration() -> None:
    text = workload_text(
        """
        [[streams]]
        model = "a"
        every = "10s"
        job = "1s"
        """
    )
    with pytest.raises(ConfigError, match="duration: required when there are streams"):
        loads_workload(text, config())


def test_a_job_range_must_not_end_before_it_starts() -> None:
    text = workload_text(
        """
        duration = "1m"
        [[streams]]
        model = "a"
        every = "10s"
        job = "1s"
        jobMax = "0.5s"
        """
    )
    with pytest.raises(ConfigError) as caught:
        loads_workload(text, config())
    assert [(p.path, p.message) for p in caught.value.problems] == [
        ("streams[0].jobMax", "must be at least job (1 s), or left out for a fixed job")
    ]


def test_a_workload_with_nothing_to_run_is_a_problem_not_an_empty_table() -> None:
    with pytest.raises(ConfigError, match=r"requests: nothing to run: add \[\[requests\]\]"):
        loads_workload('seed = 3\nduration = "1m"\n', config())


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("seed = \n", 1, 8, "invalid TOML: invalid value"),
        (
            "[[streams]\n",
            1,
            10,
            "invalid TOML: expected ']]' at the end of an array declaration",
        ),
    ],
)
def test_a_toml_syntax_error_is_one_problem_with_line_and_column(
    text: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        loads_workload(text, config(), file="w.toml")
    assert [p.render("w.toml") for p in caught.value.problems] == [
        f"w.toml:{line}:{column}: {message}"
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe[[requests]]\n", "the file is not UTF-8 text (byte 0)"),
        (b"# caf\xe9\nseed = 1\n", "the file is not UTF-8 text (byte 5)"),
        (None, "cannot read the file: no such file or directory"),
        (b"", "cannot read the file: is a directory"),
    ],
)
def test_a_file_that_cannot_be_read_is_said_as_of_a_config(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "w.toml"
    if content == b"":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_workload(str(path), config())
    assert [p.render(str(path)) for p in caught.value.problems] == [f"{path}: {message}"]


def test_the_same_seed_gives_the_same_arrivals_and_another_seed_others() -> None:
    text = workload_text(
        """
        seed = 3
        duration = "10m"
        [[streams]]
        model = "a"
        priority = "interactive"
        every = "5s"
        job = "1s"
        jobMax = "2s"
        [[requests]]
        at = "30s"
        model = "b"
        priority = "-7"
        job = "4s"
        """
    )
    first = jobs(loads_workload(text, config()))
    assert first == jobs(loads_workload(text, config()))
    assert first != jobs(loads_workload(text.replace("seed = 3", "seed = 4"), config()))
    assert [j.at for j in first] == sorted(j.at for j in first)
    assert [j.index for j in first] == list(range(len(first)))
    streamed = [j for j in first if j.model == "a"]
    assert 80 <= len(streamed) <= 160  # about 600 s / 5 s
    assert all(j.priority == 100 and 1.0 <= j.duration <= 2.0 for j in streamed)
    [traced] = [j for j in first if j.model == "b"]
    assert (traced.at, traced.priority, traced.duration) == (30.0, -7, 4.0)


def test_a_priority_is_a_name_or_an_integer_as_a_toml_integer_or_in_a_string() -> None:
    def priorities(*values: str) -> list[int]:
        trace = "".join(
            f'[[requests]]\nat = {at}\nmodel = "a"\njob = "1s"\npriority = {value}\n'
            for at, value in enumerate(values)
        )
        return [job.priority for job in jobs(loads_workload(trace, config()))]

    read = priorities("105", "-7", '"105"', '" Batch "', '"interactive"')
    assert read == [105, -7, 105, -100, 100]
    assert priorities("0") == priorities('"normal"') == [0]
    # Unlike the header (which counts what it cannot read as 0), a file gets an error.
    for bad, shown in (('"interactve"', "'interactve'"), ("true", "True"), ("1.5", "1.5")):
        with pytest.raises(ConfigError) as caught:
            priorities(bad)
        [problem] = caught.value.problems
        assert (problem.path, problem.message) == (
            "requests[0].priority",
            f"expected 'interactive', 'normal', 'batch' or an integer, got {shown}",
        )


# ---------------------------------------------------------------------------- the runs

# Model 'a' is loaded for a long normal request; meanwhile a batch and an interactive
# request for 'b' and a normal one for 'a' arrive. When 'a' frees, who goes next shows
# each policy: priority, affinity, or arrival order.
TRACE = """
[models.a]
load = "1s"
[models.b]
load = "1s"
[[requests]]
at = 0
model = "a"
job = "10s"
[[requests]]
at = "2s"
model = "b"
priority = "batch"
job = "1s"
[[requests]]
at = "3s"
model = "b"
priority = "interactive"
job = "1s"
[[requests]]
at = "4s"
model = "a"
job = "1s"
"""


def served_order(run: Run) -> list[int]:
    started = [o for o in run.outcomes if o.started is not None]
    return [o.job.index for o in sorted(started, key=lambda o: o.started or 0.0)]


def test_each_policy_serves_the_trace_in_its_own_order() -> None:
    cfg = config()
    workload = loads_workload(workload_text(TRACE), cfg)
    runs = {p.name: run_policy(p, cfg, workload) for p in policies(cfg, compare=True)}
    assert list(runs) == [
        "serial (this config)",
        "arrival order",
        "strict priority",
        "fifo",
        "serial + preempt",
    ]
    # serial: the interactive one (needs a swap) beats the normal one (affinity +10);
    # then the normal one for 'b'... for 'a' (0) beats batch for 'b' (-100 + 10).
    assert served_order(runs["serial (this config)"]) == [0, 2, 3, 1]
    assert runs["serial (this config)"].loads == 4
    assert served_order(runs["strict priority"]) == [0, 2, 3, 1]
    assert served_order(runs["arrival order"]) == [0, 1, 2, 3]
    assert runs["arrival order"].loads == 3  # a, b (both b requests), a
    # fifo serves the request for the loaded 'a' at once (behind the first, in its server),
    # then the queue by priority: interactive, batch.
    assert served_order(runs["fifo"]) == [0, 3, 2, 1]
    assert runs["fifo"].loads == 2
    assert runs["fifo"].aging_changed_picks is None
    # Waits, to the poll interval the supervisor probes readiness at.
    serial = {o.job.index: o for o in runs["serial (this config)"].outcomes}
    assert serial[0].wait == pytest.approx(1.0, abs=HEALTH_POLL_INTERVAL)
    assert serial[2].wait == pytest.approx(11.0 + 1.0 - 3.0, abs=2 * HEALTH_POLL_INTERVAL)


def test_a_full_queue_shows_as_not_served() -> None:
    cfg = config(CONFIG + "[routing.scheduler.settings.serial]\nmaxQueued = 1\n")
    trace = "".join(
        f'[[requests]]\nat = "{i * 0.1:.1f}s"\nmodel = "a"\njob = "5s"\n' for i in range(4)
    )
    [own] = policies(cfg)
    run = run_policy(own, cfg, loads_workload(trace, cfg))
    assert [o.error for o in run.outcomes] == [None, None, "QueueFull", "QueueFull"]
    assert figures(own.name, run).not_served == 2


def test_the_table_has_a_row_per_policy_and_a_dash_where_a_figure_does_not_apply() -> None:
    cfg = config()
    workload = loads_workload(workload_text(TRACE), cfg)
    rows = [figures(p.name, run_policy(p, cfg, workload)) for p in policies(cfg, compare=True)]
    lines = table(rows).splitlines()
    assert len(lines) == 2 + 5
    assert lines[0].startswith("| policy")
    assert lines[-2].startswith("| fifo")
    assert lines[-2].rstrip(" |").endswith("-")  # fifo has no affinity counts
    assert rows[0].interactive_p50 == rows[0].interactive_p95  # one interactive request
    assert rows[0].batch_p50 == rows[0].batch_max  # one batch request


# ------------------------------------------------------------------------- preemption

PREEMPT_CONFIG = CONFIG + "[routing.scheduler.settings.serial]\npreempt = true\n"

# A batch request for 'a' (a 192-token prompt; 64 tokens a second, its prompt read at 256
# a second), and interactive requests arriving while it is served. Loads take no time:
# every time below is exact.
PREEMPT_TRACE = """
[models.a]
tokensPerSecond = 64
promptTokensPerSecond = 256
[models.b]
load = "1s"
[[requests]]
at = 0
model = "a"
priority = "batch"
job = "4s"
promptTokens = 192
"""


def interactive(at: str, model: str = "a") -> str:
    return f'[[requests]]\nat = "{at}"\nmodel = "{model}"\npriority = "interactive"\njob = "1s"\n'


def run_of(config_text: str, trace: str) -> Run:
    cfg = config(config_text)
    [own] = policies(cfg)
    return run_policy(own, cfg, loads_workload(trace, cfg))


def served(run: Run) -> list[tuple[float | None, float | None, int]]:
    return [(o.started, o.finished, o.preemptions) for o in run.outcomes]


def test_a_preempted_request_goes_on_after_reading_its_prompt_and_answer_again() -> None:
    trace = PREEMPT_TRACE + interactive("2s")
    # Without preemption the interactive request waits for the batch one to finish.
    plain = run_of(CONFIG, trace)
    assert served(plain) == [(0.0, 4.0, 0), (4.0, 5.0, 0)]
    assert plain.preemption is None
    # With it: the batch request stops at 2 s with 128 tokens generated, the interactive
    # one is served at once, and the batch one goes on at 3 s, reading its prompt and
    # answer so far again (192 + 128 tokens at 256 a second: 1.25 s), then the 2 s left.
    run = run_of(PREEMPT_CONFIG, trace)
    assert served(run) == [(0.0, 3.0 + 1.25 + 2.0, 1), (2.0, 3.0, 0)]
    assert run.outcomes[0].recomputed_tokens == 192 + 128
    assert run.preemption == PreemptionFigures(
        preemptions=1,
        generated_tokens=4 * 64 + 64,
        recomputed_tokens=320,
        recompute_seconds=1.25,
    )
    assert run.loads == plain.loads == 1


def test_preempting_for_another_model_swaps_and_swaps_back() -> None:
    run = run_of(PREEMPT_CONFIG, PREEMPT_TRACE + interactive("2s", model="b"))
    # 'b' loads from 2 s (1 s, to the health poll), serves the interactive request; then
    # 'a' loads again (no time) and the batch request reads 1.25 s and generates 2 s more.
    [(batch_start, batch_end, once), (started, finished, never)] = served(run)
    assert (batch_start, once, never) == (0.0, 1, 0)
    assert started is not None
    assert started == pytest.approx(3.0, abs=HEALTH_POLL_INTERVAL)
    assert finished == started + 1.0
    assert batch_end == pytest.approx(finished + 1.25 + 2.0)
    assert run.loads == 3


def test_preempted_while_reading_again_gains_nothing_and_max_preemptions_holds() -> None:
    text = PREEMPT_CONFIG + "maxPreemptions = 2\n"
    trace = PREEMPT_TRACE + interactive("1s") + interactive("2.5s") + interactive("5s")
    run = run_of(text, trace)
    # Preempted at 1 s (64 tokens); back at 2 s, reading 192 + 64 tokens (1 s); preempted
    # at 2.5 s, halfway through; back at 3.5 s, reading it all again, then the 3 s left,
    # not preempted a third time: the interactive request at 5 s waits for it.
    assert served(run) == [
        (0.0, 3.5 + 1.0 + 3.0, 2),
        (1.0, 2.0, 0),
        (2.5, 3.5, 0),
        (7.5, 8.5, 0),
    ]
    assert run.preemption == PreemptionFigures(
        preemptions=2,
        generated_tokens=4 * 64 + 3 * 64,
        recomputed_tokens=256 + 256,
        recompute_seconds=0.5 + 1.0,
    )


def test_a_model_that_is_not_preemptible_runs_its_requests_to_their_end() -> None:
    text = PREEMPT_CONFIG.replace("[models.b]", "preemptible = false\n[models.b]")
    run = run_of(text, PREEMPT_TRACE + interactive("2s"))
    assert served(run) == [(0.0, 4.0, 0), (4.0, 5.0, 0)]
    assert run.preemption == PreemptionFigures(0, 5 * 64, 0, 0.0)


def test_compare_turns_preemption_the_other_way_and_the_references_never_preempt() -> None:
    cfg = config(PREEMPT_CONFIG)
    workload = loads_workload(PREEMPT_TRACE + interactive("2s"), cfg)
    runs = {p.name: run_policy(p, cfg, workload) for p in policies(cfg, compare=True)}
    assert list(runs) == [
        "serial (this config)",
        "arrival order",
        "strict priority",
        "fifo",
        "serial, no preempt",
    ]
    assert [name for name, run in runs.items() if run.preemption is not None] == [
        "serial (this config)"
    ]
    assert served(runs["strict priority"]) == served(runs["serial, no preempt"])
    rows = [figures(name, run) for name, run in runs.items()]
    lines = table(rows).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[7:10] == ["not served", "preemptions", "recomputed tokens"]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    # 320 tokens read again, of 320 generated.
    assert [c[8:10] for c in cells] == [["1", "320 (100.0 %)"]] + [["-", "-"]] * 4
    # Where no policy preempts, no preemption columns.
    plain = table([figures(name, run) for name, run in runs.items() if run.preemption is None])
    assert "preempt" not in plain.splitlines()[0]


# ----------------------------------------------------------------------------- memory

GiB = 2**30

MEMORY_CONFIG = """
[models.a]
cmd = "server ${PORT}"
memory = "10GiB"
[models.b]
cmd = "server ${PORT}"
memory = "10GiB"
[models.c]
cmd = "server ${PORT}"
memory = "10GiB"
[models.big]
cmd = "server ${PORT}"
memory = "30GiB"
[routing.scheduler]
use = "serial"
"""

# One request at a time, each model idle when the next arrives: a, then b beside it, then
# c (which needs room), then a again.
MEMORY_TRACE = "".join(
    f'[models.{model}]\nload = "0.5s"\n' for model in ("a", "b", "c", "big")
) + "".join(
    f'[[requests]]\nat = "{at}s"\nmodel = "{model}"\njob = "1s"\n'
    for at, model in ((0, "a"), (2, "b"), (4, "c"), (6, "a"))
)


def memory_run(budget: str, trace: str = MEMORY_TRACE) -> Run:
    cfg = config(MEMORY_CONFIG)
    [own] = policies(cfg)
    return run_policy(own, cfg, loads_workload(trace, cfg), parse_budget(budget))


def test_with_24_gib_two_10_gib_models_run_together_and_a_third_evicts_one() -> None:
    run = memory_run("gpu0=24GiB")  # a budget of 23.5 GiB: 24 GiB less the 512 MiB headroom
    assert run.memory == MemoryFigures(
        budgets="gpu0=24 GiB", peaks={"gpu0": 20 * GiB}, evictions=2, out_of_memory=()
    )
    # a, b (beside a), c (evicting a: the tie goes to the first name), a (evicting b).
    assert run.loads == 4
    # Each request waits for its model's load (0.5 s, to the supervisor's poll), a again too.
    for outcome in run.outcomes:
        assert outcome.wait == pytest.approx(0.5, abs=HEALTH_POLL_INTERVAL)


def test_with_48_gib_nothing_is_evicted_and_there_are_fewer_loads() -> None:
    run = memory_run("gpu0=48GiB")
    assert run.memory == MemoryFigures(
        budgets="gpu0=48 GiB", peaks={"gpu0": 30 * GiB}, evictions=0, out_of_memory=()
    )
    assert run.loads == 3
    assert run.outcomes[3].wait == 0.0  # a was still loaded: served at once
    assert [o.error for o in run.outcomes] == [None] * 4


def test_without_a_budget_the_groups_rules_decide_and_the_peak_is_still_counted() -> None:
    cfg = config(MEMORY_CONFIG)
    [own] = policies(cfg)
    run = run_policy(own, cfg, loads_workload(MEMORY_TRACE, cfg))
    # No budget on gpu0 (no GPU is read in a simulation): one model at a time, as ever.
    assert run.memory == MemoryFigures(
        budgets="-", peaks={"gpu0": 10 * GiB}, evictions=3, out_of_memory=()
    )
    assert run.loads == 4


def test_a_model_that_does_not_fit_even_alone_fails_its_load_as_out_of_memory() -> None:
    trace = MEMORY_TRACE + '[[requests]]\nat = "8s"\nmodel = "big"\njob = "1s"\n'
    run = memory_run("gpu0=24GiB", trace)
    assert run.memory is not None
    # The fit rule evicts everything and loads anyway; the simulated server runs out of
    # memory at once, and with nothing idle left to evict the router does not retry.
    assert run.memory.out_of_memory == ("big",)
    assert run.memory.evictions == 2 + 2
    assert [o.error for o in run.outcomes] == [None, None, None, None, "ModelStartFailed"]
    row = figures("serial", run)
    assert (row.not_served, row.out_of_memory, row.evictions) == (1, 1, 4)
    assert unfit(parse_budget("gpu0=24GiB").applied(config(MEMORY_CONFIG))) == [
        "model 'big' needs 30 GiB on gpu0, more than the 23.5 GiB of its budget even alone: "
        "its loads fail out of memory"
    ]
    served = memory_run("gpu0=48GiB", trace)
    assert served.memory is not None
    assert served.memory.out_of_memory == ()
    assert served.outcomes[4].error is None
    assert served.memory.peaks == {"gpu0": 40 * GiB}  # big, and one of a, b and c beside it


def test_the_table_shows_the_memory_columns_only_where_memory_is_declared() -> None:
    rows = [figures("serial", memory_run(b)) for b in ("gpu0=24GiB", "gpu0=48GiB")]
    lines = table(rows).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == [
        "policy",
        "memory",
        "interactive p50",
        "interactive p95",
        "batch p50",
        "batch max",
        "loads",
        "evictions",
        "makespan",
        "not served",
        "out of memory",
        "peak gpu0",
        "aging changed pick",
        "affinity changed pick",
    ]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [(c[1], c[6], c[7], c[10], c[11]) for c in cells] == [
        ("gpu0=24 GiB", "4", "2", "0", "20 GiB"),
        ("gpu0=48 GiB", "3", "0", "0", "30 GiB"),
    ]
    cfg = config()
    [own] = policies(cfg)
    plain = table([figures(own.name, run_policy(own, cfg, loads_workload(TRACE, cfg)))])
    assert "memory" not in plain
    assert "peak" not in plain


def test_a_budget_reads_device_sizes_and_a_bare_size_is_on_gpu0() -> None:
    assert parse_budget("gpu0=24GiB, gpu1 = 8GiB").memory == {"gpu0": 24 * GiB, "gpu1": 8 * GiB}
    assert parse_budget("24GiB") == Budget({"gpu0": 24 * GiB})
    assert parse_budget("gpu1=1.5GiB,gpu0=24GiB").label == "gpu0=24 GiB, gpu1=1.5 GiB"
    for bad, message in (
        ("gpu0", "expected a number of bytes or a size like \"22GiB\", got 'gpu0'"),
        ("gpu0=", "gpu0: expected a number of bytes or a size like \"22GiB\", got ''"),
        ("24GiB,gpu1=8GiB", "expected DEVICE=SIZE, got '24GiB'"),
        ("gpu0=1GiB,gpu0=2GiB", "device 'gpu0' is named twice"),
        ("gpu0=lots", "gpu0: expected a number of bytes or a size like \"22GiB\", got 'lots'"),
    ):
        message += " (e.g. 24GiB, or gpu0=20GiB,gpu1=4GiB)"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            parse_budget(bad)


def test_a_budget_keeps_the_configs_headroom() -> None:
    text = MEMORY_CONFIG + '[devices.gpu0]\nmemory = "16GiB"\nheadroom = "4GiB"\n'
    cfg = config(text)
    [own] = policies(cfg)
    # 24 GiB less 4 GiB: exactly two 10 GiB models.
    run = run_policy(own, cfg, loads_workload(MEMORY_TRACE, cfg), parse_budget("gpu0=24GiB"))
    assert run.memory is not None
    assert (run.memory.peaks, run.memory.evictions) == ({"gpu0": 20 * GiB}, 2)
    declared = run_policy(own, cfg, loads_workload(MEMORY_TRACE, cfg))  # 12 GiB: one
    assert declared.memory is not None
    assert (declared.memory.budgets, declared.memory.peaks) == ("gpu0=16 GiB", {"gpu0": 10 * GiB})


def test_a_budget_that_could_change_nothing_is_a_problem() -> None:
    assert budget_problem(parse_budget("gpu0=24GiB"), config(MEMORY_CONFIG)) is None
    assert budget_problem(parse_budget("gpu1=24GiB"), config(MEMORY_CONFIG)) == (
        "--memory gpu1=24 GiB: no model's memory is on gpu1; the models' devices: gpu0"
    )
    assert budget_problem(parse_budget("24GiB"), config()) == (
        "--memory gpu0=24 GiB: no model in the config declares memory, so no budget changes "
        'what it does; give the models memory = "22GiB" (models.NAME.memory)'
    )
