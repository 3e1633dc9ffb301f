"""The figures of a run, as a table and as a plot."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import attrs

from llamaswap.observability.activity_stats import percentile
from llamaswap.resources import format_size
from llamaswap.schedulers import band_of

from .run import PreemptionFigures, Run

__all__ = ["PLOT_FORMATS", "Figures", "figures", "plot", "plot_problem", "table"]

#: What ``--plot PATH`` may end in: formats matplotlib writes with nothing more installed.
PLOT_FORMATS = (".png", ".svg", ".pdf")
_NO_MATPLOTLIB = "--plot needs matplotlib: pip install 'llamaswap[plot]'"


@attrs.frozen
class Figures:
    """What ``simulate`` prints for one policy. Waits are in seconds, from arrival to grant.

    ``preemption`` is None (and its columns absent, unless another row has it) when the
    policy does not preempt. The memory figures are None (and their columns absent) when
    no model declares ``memory``: ``memory`` the devices' declared budgets,
    ``evictions`` the models stopped to make room, ``out_of_memory`` the loads that
    failed for memory, ``peaks`` the most the simulated servers held at once, by device.
    """

    policy: str
    interactive_p50: float | None
    interactive_p95: float | None
    batch_p50: float | None
    batch_max: float | None
    loads: int
    makespan: float
    not_served: int
    aging_changed_picks: int | None
    affinity_changed_picks: int | None
    memory: str | None = None
    evictions: int | None = None
    out_of_memory: int | None = None
    peaks: Mapping[str, int] | None = None
    #: What preemption cost (``PreemptionFigures``); None where the policy does not preempt.
    preemption: PreemptionFigures | None = None


def waits(run: Run, band: str) -> list[float]:
    """The waits of the served requests of ``band``."""
    return [o.wait for o in run.outcomes if o.wait is not None and band_of(o.job.priority) == band]


def figures(policy: str, run: Run) -> Figures:
    interactive, batch = waits(run, "interactive"), waits(run, "batch")
    finished = [o.finished for o in run.outcomes if o.finished is not None]
    first = min((o.job.at for o in run.outcomes), default=0.0)
    memory = run.memory
    return Figures(
        policy=policy,
        interactive_p50=percentile(interactive, 0.5),
        interactive_p95=percentile(interactive, 0.95),
        batch_p50=percentile(batch, 0.5),
        batch_max=max(batch, default=None),
        loads=run.loads,
        makespan=max(finished, default=first) - first,
        not_served=sum(o.error is not None for o in run.outcomes),
        aging_changed_picks=run.aging_changed_picks,
        affinity_changed_picks=run.affinity_changed_picks,
        memory=None if memory is None else memory.budgets,
        evictions=None if memory is None else memory.evictions,
        out_of_memory=None if memory is None else len(memory.out_of_memory),
        peaks=None if memory is None else memory.peaks,
        preemption=run.preemption,
    )


_COLUMNS = (
    ("policy", "policy"),
    ("interactive p50", "interactive_p50"),
    ("interactive p95", "interactive_p95"),
    ("batch p50", "batch_p50"),
    ("batch max", "batch_max"),
    ("loads", "loads"),
    ("makespan", "makespan"),
    ("not served", "not_served"),
    ("aging changed pick", "aging_changed_picks"),
    ("affinity changed pick", "affinity_changed_picks"),
)
#: The memory columns (title, field) and the column each goes after.
_MEMORY_COLUMNS = (
    ("memory", "memory", "policy"),
    ("evictions", "evictions", "loads"),
    ("out of memory", "out_of_memory", "not served"),
)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f} s"
    return str(value)


Column = tuple[str, Callable[[Figures], str]]


def _preemptions(row: Figures) -> str:
    return "-" if row.preemption is None else str(row.preemption.preemptions)


def _recomputed(row: Figures) -> str:
    """Recomputed tokens, and what fraction of the generated ones they are."""
    found = row.preemption
    if found is None:
        return "-"
    return f"{found.recomputed_tokens} ({100 * found.recomputed_fraction:.1f} %)"


#: The preemption columns, after ``not served``, where a row preempts.
_PREEMPTION_COLUMNS: tuple[Column, ...] = (
    ("preemptions", _preemptions),
    ("recomputed tokens", _recomputed),
)


def _columns(rows: Sequence[Figures]) -> list[Column]:
    """The table's columns: the preemption ones only where a row preempts; the memory
    ones only where a row has memory figures, and a ``peak DEVICE`` for each device a
    row has a peak on, after ``out of memory``."""

    def plain(name: str) -> Callable[[Figures], str]:
        return lambda row: _cell(getattr(row, name))

    def peak(device: str) -> Callable[[Figures], str]:
        return lambda row: "-" if not row.peaks else format_size(row.peaks.get(device, 0))

    columns: list[Column] = [(title, plain(name)) for title, name in _COLUMNS]
    if any(row.preemption is not None for row in rows):
        at = 1 + [t for t, _ in columns].index("not served")
        columns[at:at] = _PREEMPTION_COLUMNS
    if all(row.memory is None for row in rows):
        return columns
    devices = sorted({device for row in rows for device in row.peaks or {}})
    for title, name, after in _MEMORY_COLUMNS:
        at = 1 + [t for t, _ in columns].index(after)
        columns.insert(at, (title, plain(name)))
        if name == "out_of_memory":
            columns[at + 1 : at + 1] = [(f"peak {d}", peak(d)) for d in devices]
    return columns


def table(rows: Sequence[Figures]) -> str:
    """A Markdown table, one row per policy (it reads as plain text too)."""
    columns = _columns(rows)
    header = [title for title, _ in columns]
    cells = [[cell(row) for _, cell in columns] for row in rows]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        padded = (
            value.ljust(width) if i == 0 else value.rjust(width)
            for i, (value, width) in enumerate(zip(values, widths, strict=True))
        )
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in cells)])


def plot_problem(path: str) -> str | None:
    """What would stop :func:`plot` writing ``path``, as a line to print; None if nothing.

    Checked before the runs, which may take minutes: a plot that cannot be written must
    not be found out only at the end. (matplotlib would also add ``.png`` to a name
    without an extension, so that a directory ``plots`` got ``plots.png`` beside it.)
    """
    where = f"--plot {path or repr('')}"
    if os.path.isdir(path):
        example = os.path.join(path, "waits.png")
        return f"{where}: is a directory; give a file name in it, such as {example}"
    if os.path.splitext(path)[1].lower() not in PLOT_FORMATS:
        endings = f"{', '.join(PLOT_FORMATS[:-1])} or {PLOT_FORMATS[-1]}"
        return f"{where}: the file name must end in {endings}"
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        return f"{where}: {directory} {what}"
    if not os.access(directory, os.W_OK | os.X_OK) or (
        os.path.exists(path) and not os.access(path, os.W_OK)
    ):
        return f"{where}: permission denied"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return _NO_MATPLOTLIB
    return None


def plot(runs: Sequence[tuple[str, Run]], path: str) -> None:
    """Waits over time, one panel per policy, one colour per band, saved to ``path``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'llamaswap[plot]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"batch": "tab:gray", "normal": "tab:blue", "interactive": "tab:red"}  # on top
    figure, axes = plt.subplots(
        len(runs), 1, sharex=True, sharey=True, figsize=(9, 2.2 * len(runs)), squeeze=False
    )
    for ax, (policy, run) in zip(axes[:, 0], runs, strict=True):
        for band, colour in colours.items():
            served = [
                o for o in run.outcomes if o.wait is not None and band_of(o.job.priority) == band
            ]
            if served:
                ax.scatter(
                    [o.job.at for o in served],
                    [o.wait for o in served],
                    s=6,
                    color=colour,
                    label=band,
                )
        ax.set_title(policy, fontsize=10, loc="left")
        ax.set_ylabel("wait (s)")
    axes[0, 0].legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("arrival (s)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
