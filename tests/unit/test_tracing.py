"""The span tree's arithmetic (``observability/tracing.py``: which phases a request had,
from when to when, and which failed) and the ``[tracing]`` table's keys."""

from __future__ import annotations

import sys
import textwrap

import pytest

from llamaswap.config import loads_config
from llamaswap.config.model import TracingConfig
from llamaswap.errors import ConfigError
from llamaswap.observability.tracing import (
    ADMISSION,
    LOAD,
    REQUEST,
    STREAMING,
    TTFB,
    UPSTREAM,
    Phase,
    open_tracing,
    phases,
)
from llamaswap.router.reload import diff_config
from tests.unit.ports import every_port_free


def test_a_request_to_a_ready_model_queues_then_waits_for_its_first_byte_then_streams() -> None:
    found = phases(
        arrival=10.0,
        dispatched_at=10.5,
        joined_load_at=None,
        granted_at=10.5,
        sent=10.6,
        first_byte=11.0,
        end=13.0,
    )
    assert found == [
        Phase(ADMISSION, 10.0, 10.5),
        Phase(UPSTREAM, 10.6, 13.0, open=True),
        Phase(TTFB, 10.6, 11.0, UPSTREAM),
        Phase(STREAMING, 11.0, 13.0, UPSTREAM, open=True),
    ]


def test_a_request_that_waited_for_its_model_has_a_load_span_from_joining_to_its_grant() -> None:
    found = phases(
        arrival=1.0,
        dispatched_at=2.0,
        joined_load_at=2.0,
        granted_at=7.0,
        sent=7.0,
        first_byte=7.5,
        end=8.0,
    )
    assert found[:2] == [Phase(ADMISSION, 1.0, 2.0), Phase(LOAD, 2.0, 7.0, REQUEST)]
    assert [phase.name for phase in found[2:]] == [UPSTREAM, TTFB, STREAMING]


def test_the_phase_a_request_ended_in_is_the_open_one() -> None:
    # Refused (or its client left) in the queue: only the admission wait, still open.
    queued = phases(
        arrival=1.0,
        dispatched_at=None,
        joined_load_at=None,
        granted_at=None,
        sent=None,
        first_byte=None,
        end=4.0,
    )
    assert queued == [Phase(ADMISSION, 1.0, 4.0, open=True)]
    # Its model failed to load.
    loading = phases(
        arrival=1.0,
        dispatched_at=1.0,
        joined_load_at=1.0,
        granted_at=None,
        sent=None,
        first_byte=None,
        end=9.0,
    )
    assert loading == [Phase(ADMISSION, 1.0, 1.0), Phase(LOAD, 1.0, 9.0, open=True)]
    # The model server never answered: no streaming span, the first-byte wait is open.
    silent = phases(
        arrival=1.0,
        dispatched_at=1.0,
        joined_load_at=None,
        granted_at=1.0,
        sent=1.0,
        first_byte=None,
        end=5.0,
    )
    assert silent[-1] == Phase(TTFB, 1.0, 5.0, UPSTREAM, open=True)
    assert STREAMING not in [phase.name for phase in silent]


def test_a_request_without_a_ticket_has_only_its_upstream_phases() -> None:
    # A peer's request, never queued here.
    found = phases(
        arrival=None,
        dispatched_at=None,
        joined_load_at=None,
        granted_at=None,
        sent=3.0,
        first_byte=3.5,
        end=4.0,
    )
    assert [phase.name for phase in found] == [UPSTREAM, TTFB, STREAMING]


def test_a_load_joined_after_the_first_grant_is_not_the_requests_load() -> None:
    # Preempted, then it waited for its model again: that wait is within its upstream span.
    found = phases(
        arrival=1.0,
        dispatched_at=1.0,
        joined_load_at=6.0,
        granted_at=1.0,
        sent=1.0,
        first_byte=2.0,
        end=9.0,
    )
    assert LOAD not in [phase.name for phase in found]


def load(text: str) -> TracingConfig | None:
    config = loads_config(textwrap.dedent(text), file="t.toml", environ={}, free=every_port_free)
    return config.tracing


def problems(text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load(text)
    return {problem.path: problem.message for problem in info.value.problems}


def test_tracing_is_off_without_its_table_and_on_with_it() -> None:
    assert load("") is None
    assert load("[tracing]\n") == TracingConfig()
    assert load(
        """
        [tracing]
        enabled = false
        endpoint = "http://collector:4318"
        serviceName = "gpu-box"
        sampleRatio = 0.25
        """
    ) == TracingConfig(False, "http://collector:4318", "gpu-box", 0.25)


def test_tracing_keys_are_checked_at_their_paths() -> None:
    found = problems('[tracing]\nendpoint = "collector:4318"\nsampleRatio = 1.5\n')
    assert found == {
        "tracing.endpoint": "expected an http:// or https:// URL, got 'collector:4318'",
        "tracing.sampleRatio": "expected a fraction of traces from 0 to 1, got 1.5",
    }


def test_tracing_without_the_otel_extra_is_a_config_error_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("llamaswap.config.validate.otel_installed", lambda: False)
    [message] = problems("[tracing]\n").values()
    assert "pip install 'llamaswap[otel]'" in message
    assert load("[tracing]\nenabled = false\n") is not None  # off: nothing is needed


def test_opentelemetry_that_is_installed_but_does_not_import_is_a_config_error_saying_how_to_mend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a fresh venv with the gateway and otel extras got when xds-protos was installed
    # last: its old opentelemetry/proto modules lack what the exporter imports.
    monkeypatch.setattr("llamaswap.observability.tracing.otel_installed", lambda: True)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError) as info:
        open_tracing(TracingConfig())
    [problem] = info.value.problems
    assert problem.path == "tracing"
    assert "do not import" in problem.message
    assert "pip install --force-reinstall --no-deps opentelemetry-proto" in problem.message


def test_a_reload_that_changes_tracing_says_it_applies_at_the_next_start() -> None:
    before = loads_config("", file="t.toml", environ={}, free=every_port_free)
    after = loads_config("[tracing]\n", file="t.toml", environ={}, free=every_port_free)
    changes = diff_config(before, after)
    assert (changes.at_start, changes.settings) == (("tracing",), ())
