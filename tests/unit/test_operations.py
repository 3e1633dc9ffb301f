"""The pure parts of live operations: clock conversion, entries, addresses, the error."""

from __future__ import annotations

import json
import math

import pytest

from llamaswap._version import version, versions
from llamaswap.config import Capabilities
from llamaswap.errors import RequestCancelled
from llamaswap.http.errors import error_response
from llamaswap.observability.props import context_length
from llamaswap.process import ModelState, ModelStatistics, StartFailure
from llamaswap.proxy.operations import (
    capability_fields,
    client_address,
    client_status,
    inflight_entry,
    iso_time,
    model_status,
    to_wall_clock,
)
from llamaswap.router.lease import RequestInfo

# 2026-01-01T00:00:00Z
WALL = 1767225600.0


def test_trio_time_converts_to_the_wall_clock_by_its_distance_from_now() -> None:
    # Trio's clock starts anywhere (here 1000.0): only "how long ago" carries over.
    assert to_wall_clock(1000.0, now=1000.0, wall_now=WALL) == WALL
    assert to_wall_clock(990.0, now=1000.0, wall_now=WALL) == WALL - 10.0
    assert to_wall_clock(1000.5, now=1000.0, wall_now=WALL) == WALL + 0.5


def test_iso_time_is_utc_with_milliseconds() -> None:
    assert iso_time(WALL) == "2026-01-01T00:00:00.000Z"
    assert iso_time(WALL - 0.25) == "2025-12-31T23:59:59.750Z"


def test_client_address() -> None:
    assert client_address(("127.0.0.1", 5123)) == "127.0.0.1:5123"
    assert client_address(("::1", 5123)) == "[::1]:5123"
    assert client_address(None) is None


def info(
    *,
    arrival: float,
    dispatched_at: float | None,
    state: str,
    preemptions: int = 0,
    paused_at: float | None = None,
) -> RequestInfo:
    return RequestInfo(
        id=7,
        model="chat",
        priority=100,
        effective_priority=105,
        band="interactive",
        state=state,
        arrival=arrival,
        dispatched_at=dispatched_at,
        score=None,
        metadata={},
        client="127.0.0.1:5123",
        route="POST /v1/chat/completions",
        preemptions=preemptions,
        paused_at=paused_at,
    )


def test_inflight_entry_waits_until_dispatch() -> None:
    queued = inflight_entry(
        info(arrival=990.0, dispatched_at=None, state="queued"), now=1000.0, wall_now=WALL
    )
    assert queued == {
        "id": 7,
        "model": "chat",
        "state": "queued",
        "priority": 105,
        "band": "interactive",
        "score": None,
        "waited_ms": 10000.0,
        "started": "2025-12-31T23:59:50.000Z",
        "client": "127.0.0.1:5123",
        "route": "POST /v1/chat/completions",
        "position": None,
        "eta_seconds": None,
        "preemptions": 0,
        "paused": False,
        "paused_ms": None,
    }
    serving = inflight_entry(
        info(arrival=990.0, dispatched_at=990.25, state="serving"), now=1000.0, wall_now=WALL
    )
    assert serving["waited_ms"] == 250.0
    estimated = inflight_entry(
        info(arrival=990.0, dispatched_at=None, state="queued"),
        now=1000.0,
        wall_now=WALL,
        eta_seconds=12.3456,
    )
    assert estimated["eta_seconds"] == 12.346


def test_a_paused_request_says_since_when_and_a_resumed_one_how_often() -> None:
    """Checkpointed at 998.5, it waits again: its wait in the queue stays what it was up to
    its first dispatch; ``paused_ms`` counts from its checkpoint."""
    paused = info(
        arrival=990.0, dispatched_at=990.25, state="queued", preemptions=1, paused_at=998.5
    )
    entry = inflight_entry(paused, now=1000.0, wall_now=WALL)
    assert (entry["state"], entry["waited_ms"]) == ("queued", 250.0)
    assert (entry["preemptions"], entry["paused"], entry["paused_ms"]) == (1, True, 1500.0)
    loading = inflight_entry(
        info(arrival=990.0, dispatched_at=990.25, state="loading", preemptions=2, paused_at=999.0),
        now=1000.0,
        wall_now=WALL,
    )
    assert (loading["paused"], loading["paused_ms"]) == (True, 1000.0)
    resumed = inflight_entry(
        info(arrival=990.0, dispatched_at=990.25, state="serving", preemptions=2, paused_at=999.0),
        now=1000.0,
        wall_now=WALL,
    )
    assert (resumed["preemptions"], resumed["paused"], resumed["paused_ms"]) == (2, False, None)


def stats(
    state: ModelState,
    *,
    ready_since: float | None = None,
    idle_deadline: float = math.inf,
    failure: StartFailure | None = None,
) -> ModelStatistics:
    return ModelStatistics(
        model="chat",
        state=state,
        pid=None,
        in_flight=0,
        starts=0,
        start_failures=0,
        crashes=0,
        last_exit_code=None,
        ready_since=ready_since,
        idle_deadline=idle_deadline,
        failure=failure,
    )


def test_model_status_stopped_and_without_ttl() -> None:
    nothing = {
        "state": "stopped",
        "loaded_since": None,
        "ttl": None,
        "ttl_left": None,
        "failure": None,
    }
    assert model_status(stats(ModelState.STOPPED), None, now=1000.0, wall_now=WALL) == nothing
    assert model_status(stats(ModelState.STOPPED), 60.0, now=1000.0, wall_now=WALL) == {
        **nothing,
        "ttl": 60.0,
    }
    ready = stats(ModelState.READY, ready_since=900.0)
    assert model_status(ready, None, now=1000.0, wall_now=WALL) == {
        "state": "ready",
        "loaded_since": "2025-12-31T23:58:20.000Z",
        "ttl": None,
        "ttl_left": None,
        "failure": None,
    }


FAILURE = StartFailure(
    "exited with status 1 while starting", "model 'chat' failed to start: ...", 1, ("oops",)
)


def test_a_failed_start_is_failed_in_meta_and_in_the_status_clients_read() -> None:
    failed = stats(ModelState.STOPPED, failure=FAILURE)
    meta = model_status(failed, 0.0, now=1000.0, wall_now=WALL)
    assert (meta["state"], meta["failure"]) == ("failed", failed.failure_json())
    assert meta["failure"] == {
        "reason": "exited with status 1 while starting",
        "message": "model 'chat' failed to start: ...",
        "exit_code": 1,
        "output": ["oops"],
    }
    assert client_status(failed) == {"value": "failed", "failed": True, "exit_code": 1}


@pytest.mark.parametrize(
    ("state", "value"),
    [
        (ModelState.STOPPED, "unloaded"),
        (ModelState.STARTING, "loading"),
        (ModelState.READY, "loaded"),
        (ModelState.STOPPING, "unloaded"),
    ],
)
def test_the_status_clients_read_uses_llama_cpp_s_words(state: ModelState, value: str) -> None:
    assert client_status(stats(state)) == {"value": value}


def test_capabilities_are_shown_as_llama_swap_shows_them() -> None:
    assert capability_fields(Capabilities()) == {}
    assert capability_fields(Capabilities(in_=("text",))) == {
        "architecture": {"input_modalities": ["text"]}
    }
    vision = Capabilities(in_=("text", "image"), out=("text",), tools=True)
    assert capability_fields(vision) == {
        "architecture": {
            "input_modalities": ["text", "image"],
            "output_modalities": ["text"],
            "modality": "text+image->text",
        },
        "capabilities": {"vision": True, "function_calling": True},
        "supported_parameters": ["tools", "tool_choice"],
    }
    everything = Capabilities(
        in_=("text", "audio", "image"), out=("text", "audio", "image"), reranker=True
    )
    assert capability_fields(everything)["capabilities"] == {
        "vision": True,
        "audio_transcriptions": True,
        "audio_speech": True,
        "image_generation": True,
        "image_to_image": True,
        "reranker": True,
    }
    assert capability_fields(Capabilities(context=8192)) == {}  # context_length says it


@pytest.mark.parametrize(
    ("props", "found"),
    [
        ({"default_generation_settings": {"n_ctx": 8192, "params": {}}, "n_ctx": 1}, 8192),
        ({"n_ctx": 4096}, 4096),  # builds that answer it at the top
        ({"default_generation_settings": {"n_ctx": 0}}, None),  # llama-server's router
        ({"default_generation_settings": {"n_ctx": True}}, None),
        ({"default_generation_settings": {"n_ctx": "4096"}}, None),
        ({"model": "x"}, None),
        ([4096], None),
        (None, None),
    ],
)
def test_the_context_length_of_a_props_answer(props: object, found: int | None) -> None:
    assert context_length(props) == found


def test_model_status_counts_down_only_while_idle_and_ready() -> None:
    idle = stats(ModelState.READY, ready_since=900.0, idle_deadline=1030.5)
    assert model_status(idle, 60.0, now=1000.0, wall_now=WALL)["ttl_left"] == 30.5
    overdue = stats(ModelState.READY, ready_since=900.0, idle_deadline=999.0)
    assert model_status(overdue, 60.0, now=1000.0, wall_now=WALL)["ttl_left"] == 0.0
    busy = stats(ModelState.READY, ready_since=900.0)  # requests in flight: no deadline
    assert model_status(busy, 60.0, now=1000.0, wall_now=WALL)["ttl_left"] is None
    starting = stats(ModelState.STARTING, idle_deadline=1030.5)
    assert model_status(starting, 60.0, now=1000.0, wall_now=WALL)["ttl_left"] is None


def test_request_cancelled_is_a_499_that_names_the_api() -> None:
    status, headers, body = error_response(RequestCancelled(12))
    assert status == 499
    assert headers == [("content-type", "application/json")]
    assert json.loads(body) == {
        "error": {
            "message": "request #12 was cancelled by an operator, via the API "
            "(POST /api/inflight/12/cancel)",
            "type": "server_error",
            "code": "request_cancelled",
            "param": None,
        }
    }


@pytest.mark.parametrize("key", ["version", "python", "trio", "hypercorn"])
def test_versions_are_dotted_numbers(key: str) -> None:
    assert versions()[key].split(".")[0].isdigit()
    assert versions()["version"] == version()
