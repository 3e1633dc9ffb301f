"""A workload file (``llamaswap simulate --workload W.toml``): who asks for what, and when.

::

    seed = 7                 # the same seed gives the same arrivals
    duration = "10m"         # streams send requests for this long

    [models.chat]
    load = "0.4s"            # from start to ready (default 0)
    parallel = 1             # requests its server works on at once; more queue inside it
    tokensPerSecond = 100    # generation speed (default 100): counts the tokens of a job
    promptTokensPerSecond = 1000  # prompt reading speed (default 1000): what resuming a
                                  # preempted request costs (docs/scheduling.md)

    [[streams]]              # Poisson arrivals
    model = "chat"           # an ID or alias from the config
    priority = "interactive" # as in the X-LlamaSwap-Priority header, or an integer: 105
    every = "5s"             # mean time between two arrivals
    job = "1s"               # time in service; with jobMax, uniform in [job, jobMax]
    jobMax = "3s"
    promptTokens = 0         # its prompt, read again when a preempted request resumes

    [[requests]]             # an explicit trace, alone or beside streams
    at = "2s"
    model = "chat"
    priority = "batch"
    job = "5s"

Read with the config's converter, so a bad workload gets every problem with its key path,
as a bad config does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import NewType

import attrs

from llamaswap.config import Config
from llamaswap.config.convert import faults, make_converter
from llamaswap.config.load import parse_toml, read_text
from llamaswap.config.model import within
from llamaswap.config.values import Bounds, InvalidValue, describe, scalar
from llamaswap.errors import ConfigError, ConfigProblem
from llamaswap.keypaths import Path, Problem, format_path, suggestion
from llamaswap.schedulers.priority import priority_named

__all__ = ["Job", "ModelTimes", "Workload", "jobs", "load_workload", "loads_workload"]

SPAN = Bounds(0, 31_536_000, "a duration", "seconds", "1 year")
EVERY = Bounds(0.001, 31_536_000, "a duration", "seconds", "1 year")
SEED = Bounds(0, 1_000_000_000, "a seed")
PARALLEL = Bounds(1, 256, "a number of requests")
RATE = Bounds(1, 10_000_000, "a number of tokens a second")
TOKENS = Bounds(0, 10_000_000, "a number of tokens")

#: ``priority``: what the header would say (a band's name or an integer, in a string), or
#: a TOML integer; read into the number the scheduler uses.
Priority = NewType("Priority", int)


def _priority(value: object, _: object) -> Priority:
    """A workload's ``priority``. Unlike the header, which counts a value it cannot read as
    0, a file gets an error: a misspelt ``"interactve"`` would quietly skew the figures."""
    value = scalar(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return Priority(value)
    named = priority_named(value) if isinstance(value, str) else None
    if named is None:
        raise InvalidValue(
            f"expected 'interactive', 'normal', 'batch' or an integer, got {describe(value)}"
        )
    return Priority(named)


@attrs.frozen
class ModelTimes:
    """``[models.ID]``: how the model's server behaves."""

    load: float = attrs.field(default=0.0, metadata=within(SPAN))
    parallel: int = attrs.field(default=1, metadata=within(PARALLEL))
    #: Generation speed: a job of ``t`` seconds generates ``t * tokens_per_second`` tokens.
    tokens_per_second: int = attrs.field(default=100, metadata=within(RATE))
    #: Prompt reading speed: a preempted request, resumed, has its prompt and its answer so
    #: far read again at this rate before it goes on generating.
    prompt_tokens_per_second: int = attrs.field(default=1000, metadata=within(RATE))


_DEFAULT_SERVER = ModelTimes()


@attrs.frozen
class Stream:
    """``[[streams]]``: requests arriving at random, ``every`` seconds on average."""

    model: str
    every: float = attrs.field(metadata=within(EVERY))
    job: float = attrs.field(metadata=within(SPAN))
    job_max: float = attrs.field(default=0.0, metadata=within(SPAN))
    priority: Priority = Priority(0)
    prompt_tokens: int = attrs.field(default=0, metadata=within(TOKENS))


@attrs.frozen
class TraceRequest:
    """``[[requests]]``: one request at a given time."""

    at: float = attrs.field(metadata=within(SPAN))
    model: str
    job: float = attrs.field(metadata=within(SPAN))
    priority: Priority = Priority(0)
    prompt_tokens: int = attrs.field(default=0, metadata=within(TOKENS))


@attrs.frozen
class Workload:
    seed: int = attrs.field(default=0, metadata=within(SEED))
    duration: float = attrs.field(default=0.0, metadata=within(SPAN))
    models: Mapping[str, ModelTimes] = attrs.field(factory=dict)
    streams: tuple[Stream, ...] = ()
    requests: tuple[TraceRequest, ...] = ()

    def server(self, model: str) -> ModelTimes:
        return self.models.get(model, _DEFAULT_SERVER)


@attrs.frozen
class Job:
    """One request of a workload: arrives ``at``, for ``model`` (an ID), in service for
    ``duration`` seconds once its server starts on it (not counting what resuming it
    after a preemption costs); its prompt is ``prompt_tokens`` long."""

    index: int
    at: float
    model: str
    priority: int
    duration: float
    prompt_tokens: int = 0


def loads_workload(text: str, config: Config, *, file: str = "<workload>") -> Workload:
    """The workload in ``text``, its model names resolved to IDs of ``config``.

    Raises:
        ConfigError: every problem in the workload, with its key path. Names of no model
            are found in the file as written, so they are told together with the values
            that cannot be read; what needs those values (a stream's ``jobMax`` against
            its ``job``) once they can be.
    """
    converter = make_converter()
    converter.register_structure_hook(Priority, _priority)
    raw = parse_toml(text, file)  # a syntax error: its own ConfigError, with line:column
    known = sorted(config.models)
    problems = [
        Problem(path, f"no model {name!r} in the config; {suggestion(name, known, noun='models')}")
        for name, path in _model_names(raw)
        if config.resolve(name) is None
    ]
    try:
        workload = converter.structure(raw, Workload)
    except Exception as exc:  # a cattrs exception group: every problem in it
        found = [fault.problem for fault in faults(exc)]
        raise ConfigError(file, _problems([*found, *problems])) from None
    if workload.streams and not workload.duration:
        problems.append(Problem(("duration",), "required when there are streams"))
    for index, stream in enumerate(workload.streams):
        if stream.job_max and stream.job_max < stream.job:
            message = f"must be at least job ({stream.job:g} s), or left out for a fixed job"
            problems.append(Problem(("streams", index, "jobMax"), message))
    if not workload.streams and not workload.requests:
        problems.append(Problem(("requests",), "nothing to run: add [[requests]] or [[streams]]"))
    if problems:
        raise ConfigError(file, _problems(problems))

    def model_id(name: str) -> str:
        return config.resolve(name) or name  # every name resolves: checked above

    return attrs.evolve(
        workload,
        models={model_id(name): times for name, times in workload.models.items()},
        streams=tuple(attrs.evolve(s, model=model_id(s.model)) for s in workload.streams),
        requests=tuple(attrs.evolve(r, model=model_id(r.model)) for r in workload.requests),
    )


def _model_names(raw: Mapping[str, object]) -> Iterator[tuple[str, Path]]:
    """Every model name the file gives, as written, with its key path: the tables under
    ``[models]``, and each stream's and request's ``model`` that is a string (one that is
    not is a problem of its own)."""
    models = raw.get("models")
    if isinstance(models, Mapping):
        for name in models:
            yield str(name), ("models", str(name))
    for key in ("streams", "requests"):
        entries = raw.get(key)
        for index, entry in enumerate(entries if isinstance(entries, list) else []):
            name = entry.get("model") if isinstance(entry, Mapping) else None
            if isinstance(name, str):
                yield name, (key, index, "model")


def load_workload(path: str, config: Config) -> Workload:
    """The workload file at ``path`` (see :func:`loads_workload`).

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, or is not a valid workload;
            as :func:`~llamaswap.config.load_config` says it of a config file.
    """
    return loads_workload(read_text(path), config, file=path)


def jobs(workload: Workload) -> list[Job]:
    """Every request of ``workload`` in arrival order; the same seed, the same list."""
    rng = random.Random(workload.seed)
    found: list[tuple[float, str, int, float, int]] = []
    for stream in workload.streams:
        at = rng.expovariate(1 / stream.every)
        while at < workload.duration:
            duration = rng.uniform(stream.job, max(stream.job, stream.job_max))
            found.append((at, stream.model, stream.priority, duration, stream.prompt_tokens))
            at += rng.expovariate(1 / stream.every)
    found.extend((r.at, r.model, r.priority, r.job, r.prompt_tokens) for r in workload.requests)
    found.sort(key=lambda job: job[0])  # stable: a trace keeps its order among equal times
    return [Job(index, *job) for index, job in enumerate(found)]


def _problems(problems: list[Problem]) -> list[ConfigProblem]:
    return [ConfigProblem(format_path(p.path), p.message) for p in problems]
