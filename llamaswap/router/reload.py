"""What a reload changes: the diff between two configurations, model by model (SPEC §3.7).

A model is compared on its *effective* definition, after macros. Only what defines the
process — ``cmd``, ``env``, ``proxy``, ``checkEndpoint`` — needs a new process; every
other key (``ttl``, ``aliases``, filters, ``concurrencyLimit``, ``unloadTimeout``, names,
metadata, …) applies to the running one at once. This is the row llama-swap lacks: it
restarts every model on reload.
"""

from __future__ import annotations

from typing import Any

import attrs

from llamaswap.config.model import Config, ModelConfig, toml_key

__all__ = ["ConfigChanges", "diff_config", "process_definition"]

#: Top-level keys whose change only takes effect when llamaswap starts again (the startup
#: hook's preload list runs once, at start; the activity store is opened once, at start;
#: the console log is set up once, at start, with ``--log-level`` over ``logLevel``; the
#: tracer and its exporter are made once, at start).
_AT_START = {"hooks", "store", "tracing", "log_level", "log_to_stdout", "log_time_format"}


def process_definition(model: ModelConfig) -> tuple[Any, ...]:
    """What, if it changes, needs a new process."""
    return (model.cmd, tuple(sorted(model.env.items())), model.proxy, model.check_endpoint)


@attrs.frozen
class ConfigChanges:
    """Model IDs by what a reload does to them, and the other keys that changed."""

    added: tuple[str, ...] = ()  # servable at once
    removed: tuple[str, ...] = ()  # queued requests fail (503); stops once drained
    restarted: tuple[str, ...] = ()  # new process once its requests in flight are done
    updated: tuple[str, ...] = ()  # same process; other keys apply at once
    unchanged: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()  # top-level keys that changed, applied at once
    at_start: tuple[str, ...] = ()  # changed keys that apply when llamaswap starts again

    def to_json(self) -> dict[str, list[str]]:
        return {key: list(value) for key, value in attrs.asdict(self).items()}

    def describe(self) -> str:
        """What changed, for the log: ``added 'beta'; restarted 'alpha'; settings
        globalTTL``, or ``no change`` (the unchanged models and the keys that apply at the
        next start are left out: the latter get a warning line each)."""
        models = [
            f"{what} {', '.join(map(repr, ids))}"
            for what, ids in (
                ("added", self.added),
                ("removed", self.removed),
                ("restarted", self.restarted),
                ("updated", self.updated),
            )
            if ids
        ]
        settings = [f"settings {', '.join(self.settings)}"] if self.settings else []
        return "; ".join(models + settings) or "no change"


def diff_config(old: Config, new: Config) -> ConfigChanges:
    """How ``new`` differs from ``old``; see the module docstring."""
    added: list[str] = []
    removed: list[str] = []
    restarted: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    for model_id in sorted(old.models.keys() | new.models.keys()):
        before, after = old.models.get(model_id), new.models.get(model_id)
        if before is None:
            added.append(model_id)
        elif after is None:
            removed.append(model_id)
        elif process_definition(before) != process_definition(after):
            restarted.append(model_id)
        elif before != after:
            updated.append(model_id)
        else:
            unchanged.append(model_id)
    settings: list[str] = []
    at_start: list[str] = []
    for field in attrs.fields(Config):
        if field.name == "models" or getattr(old, field.name) == getattr(new, field.name):
            continue
        (at_start if field.name in _AT_START else settings).append(toml_key(field))
    return ConfigChanges(
        added=tuple(added),
        removed=tuple(removed),
        restarted=tuple(restarted),
        updated=tuple(updated),
        unchanged=tuple(unchanged),
        settings=tuple(settings),
        at_start=tuple(at_start),
    )
