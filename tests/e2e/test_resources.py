"""Resources end to end, without a GPU: the real proxy places real fake servers by memory.

The GPU is the probe's test double (``FileProbe``): the proxy runs with
``LLAMASWAP_FAKE_GPU`` naming a folder whose ``devices.json`` the test writes, and each
fake server started with ``--memory`` "allocates" there once loaded (``PID.json``), failing
with llama.cpp's CUDA out-of-memory lines where a device is full. So the fit rule, the
learned figures, the out-of-memory retry and the GPU series all run as in production, on
real processes, real HTTP and the real clock. Every wait is bounded; conditions with no
event to wait on (a sample taken, a figure kept) are polled with a deadline.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from llamaswap.resources.probe import FAKE_GPU_ENV, NVML_MISSING
from tests.e2e.conftest import StartProxy
from tests.e2e.harness import (
    REPO,
    ProxyProcess,
    alive,
    pid_of,
    running,
    start_proxy,
    stop_proxy,
    wait_until,
)
from tests.e2e.test_proxy import chat, config

GiB = 2**30

StartGpuProxy = Callable[..., Awaitable[ProxyProcess]]


def fake_gpu(folder: Path, **totals: int) -> Path:
    """A test-double GPU folder holding ``devices.json`` with ``totals`` (bytes by device)."""
    folder.mkdir()
    devices = {name: {"total": total, "name": "Fake GPU"} for name, total in totals.items()}
    (folder / "devices.json").write_text(json.dumps(devices))
    return folder


@pytest.fixture
async def gpu_proxy(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[StartGpuProxy]:
    """Start real proxies with ``env`` added to their environment (the fake GPU's folder);
    each is stopped and checked for survivors after the test."""
    started: list[ProxyProcess] = []

    async def start(text: str, env: Mapping[str, str]) -> ProxyProcess:
        proxy = await start_proxy(nursery, text, tmp_path, env=env)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        await stop_proxy(proxy)


async def ask(client: httpx.AsyncClient, model: str) -> None:
    response = await client.post("/v1/chat/completions", json=chat(model, max_tokens=2))
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model


async def resources(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/api/resources")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


async def device(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    devices = {view["name"]: view for view in (await resources(client))["devices"]}
    view: dict[str, Any] = devices[name]
    return view


async def poll(condition: Callable[[], Awaitable[bool]], *, within: float) -> None:
    """Ask ``condition`` until it holds (the sampler runs every 2 s and at each ready)."""
    with trio.fail_after(within):
        while not await condition():  # noqa: ASYNC110 (no event says "sampled")
            await trio.sleep(0.05)


async def samples(client: httpx.AsyncClient) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of ``/metrics``: (name, labels, value)."""
    text = (await client.get("/metrics")).text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


# --- the fit rule ------------------------------------------------------------------------

FIT = """
[models.a]
cmd = "${fake} --load-seconds 1 --memory 10GiB"
memory = "10GiB"
[models.b]
cmd = "${fake} --memory 8GiB"
memory = "8GiB"
[models.c]
cmd = "${fake} --memory 12GiB"
memory = "12GiB"
"""


async def test_models_that_fit_run_together_and_a_load_evicts_the_cheapest_set(
    gpu_proxy: StartGpuProxy, tmp_path: Path
) -> None:
    # 24 GiB less the default 512 MiB headroom: a and b (18) fit together, all three (30)
    # do not, and c fits beside either. Evicting b is cheaper (its load took ~0.3 s, a's
    # over 1 s), though a is the larger: c evicts b, and only b.
    gpu = fake_gpu(tmp_path / "gpu", gpu0=24 * GiB)
    proxy = await gpu_proxy(config(FIT), {FAKE_GPU_ENV: str(gpu)})
    async with proxy.client() as client:
        with trio.fail_after(60):
            await ask(client, "a")
            await ask(client, "b")  # no groups, yet a stays: the fit rule decides
            both = await running(client)
            assert set(both) == {"a", "b"}
            assert all(entry["state"] == "ready" for entry in both.values())
            pids = {model: await pid_of(client, model) for model in both}

            async def both_held() -> bool:
                view = await device(client, "gpu0")
                return bool(view["models"] == {"a": 10 * GiB, "b": 8 * GiB})

            await poll(both_held, within=10)
            view = await device(client, "gpu0")
            assert (view["total"], view["used"]) == (24 * GiB, 18 * GiB)
            assert view["budget"] == 24 * GiB - 512 * 2**20

            await ask(client, "c")
            after = await running(client)
            assert set(after) == {"a", "c"}
            assert after["a"]["pid"] == pids["a"]  # not restarted
            assert alive(pids["a"])
            assert not alive(pids["b"])
        logs = (await client.get("/logs")).text
    assert "loading model 'b' (needs 8 GiB on gpu0, declared)\n" in logs  # evicting nothing
    assert "loading model 'c' (needs 12 GiB on gpu0, declared), evicting ['b']" in logs
    assert "retrying" not in logs


# --- learned figures ---------------------------------------------------------------------

LEARNED = """
[models.m]
cmd = "${fake} --memory 6GiB"
"""


def kept(store: Path, model: str) -> dict[str, int]:
    """``model``'s learned figure as the ``[store]`` file holds it (read-only)."""
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as connection:
        rows = connection.execute(
            "SELECT device, bytes FROM learned_memory WHERE model = ?", (model,)
        )
        return dict(rows.fetchall())


async def test_a_model_s_memory_is_learned_shown_measured_and_kept(
    gpu_proxy: StartGpuProxy, tmp_path: Path
) -> None:
    gpu = fake_gpu(tmp_path / "gpu", gpu0=24 * GiB)
    store = tmp_path / "activity.db"
    text = config(LEARNED + f"[store]\npath = {json.dumps(str(store))}\n")
    env = {FAKE_GPU_ENV: str(gpu)}
    proxy = await gpu_proxy(text, env)
    learned = {"memory": {"gpu0": 6 * GiB}, "memory_source": "learned"}
    async with proxy.client() as client:
        with trio.fail_after(60):
            before = (await resources(client))["models"]["m"]
            assert (before["memory"], before["memory_source"]) == (None, None)
            await ask(client, "m")

            async def is_learned() -> bool:
                entry = (await running(client))["m"]
                return {key: entry[key] for key in learned} == learned

            await poll(is_learned, within=10)
            assert (await running(client))["m"]["memory_held"] == {"gpu0": 6 * GiB}
            model = (await resources(client))["models"]["m"]
            assert {key: model[key] for key in learned} == learned
            assert model["load_seconds"] > 0
            view = await device(client, "gpu0")
            assert (view["label"], view["used"], view["models"]) == (
                "Fake GPU",
                6 * GiB,
                {"m": 6 * GiB},
            )

            series = await samples(client)
            assert ("llamaswap_model_memory_bytes", {"model": "m", "device": "gpu0"}, 6 * GiB) in (
                series
            )
            need = {"model": "m", "device": "gpu0", "source": "learned"}
            assert ("llamaswap_model_memory_need_bytes", need, 6 * GiB) in series
            gpu_labels = {"device": "gpu0", "name": "Fake GPU"}
            assert ("llamaswap_gpu_memory_used_bytes", gpu_labels, 6 * GiB) in series
            assert ("llamaswap_gpu_memory_total_bytes", gpu_labels, 24 * GiB) in series

            # The store is written just after the sample that learned it: wait for it.
            await wait_until(lambda: kept(store, "m") == {"gpu0": 6 * GiB}, within=10)
    assert await proxy.terminate() == 0

    # A restarted proxy knows the figure before any load of m.
    again = await gpu_proxy(text, env)
    async with again.client() as client:
        with trio.fail_after(30):
            model = (await resources(client))["models"]["m"]
            assert model["state"] == "stopped"
            assert {key: model[key] for key in learned} == learned
            assert model["memory_held"] == {}
            assert await running(client) == {}


# --- the out-of-memory retry -------------------------------------------------------------

UNDERSTATED = """
[models.x]
cmd = "${fake} --memory 12GiB"
memory = "4GiB"
[models.y]
cmd = "${fake} --memory 8GiB"
memory = "4GiB"
"""


async def test_a_load_that_runs_out_of_memory_is_retried_once_after_evicting_idle_models(
    gpu_proxy: StartGpuProxy, tmp_path: Path
) -> None:
    # By the (understated) figures x fits beside y: 4 + 4 of 15.5 GiB. In fact y holds 8
    # and x asks for 12 of 16: x's first start fails with CUDA's message, and the retry,
    # with y evicted, succeeds, within the same request.
    gpu = fake_gpu(tmp_path / "gpu", gpu0=16 * GiB)
    proxy = await gpu_proxy(config(UNDERSTATED), {FAKE_GPU_ENV: str(gpu)})
    async with proxy.client() as client:
        with trio.fail_after(60):
            await ask(client, "y")
            y_pid = await pid_of(client, "y")
            response = await client.post("/v1/chat/completions", json=chat("x", max_tokens=2))
            assert response.status_code == 200, response.text
            assert response.json()["model"] == "x"
            assert set(await running(client)) == {"x"}
            assert not alive(y_pid)
            logs = (await client.get("/logs")).text
            records = (await client.get("/api/activity", params={"model": "x"})).json()
    oom = (
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 12288.00 MiB on device 0: "
        "cudaMalloc failed: out of memory"
    )
    assert oom in logs  # the fake's own stderr, in x's log
    assert "loading model 'x' (needs 4 GiB on gpu0, declared)\n" in logs  # no eviction
    retry = "retrying the load of 'x' (needs 4 GiB on gpu0, declared), evicting ['y']: "
    assert f"{retry}out of memory: " in logs
    assert logs.count("retrying the load of 'x'") == 1
    (record,) = records["activity"]
    assert record["status"] == 200
    retried = record["metadata"]["retried"]
    assert retried.startswith("out of memory: ")
    assert oom in retried


# --- without a probe ---------------------------------------------------------------------


async def test_without_a_probe_the_reason_is_given_and_no_gpu_series_exist(
    gpu_proxy: StartGpuProxy, tmp_path: Path
) -> None:
    # No test double (the variable empty), and nvidia-ml-py made unimportable whether or
    # not this machine has it: a module of its name that refuses to import comes first.
    hidden = tmp_path / "no-nvml"
    hidden.mkdir()
    (hidden / "pynvml.py").write_text('raise ImportError("hidden by the test")\n')
    path = os.pathsep.join(filter(None, [str(hidden), str(REPO), os.environ.get("PYTHONPATH")]))
    env = {FAKE_GPU_ENV: "", "PYTHONPATH": path}
    text = config('[models.m]\ncmd = "${fake}"\nmemory = "4GiB"\n')
    proxy = await gpu_proxy(text, env)
    async with proxy.client() as client:
        with trio.fail_after(30):
            await ask(client, "m")
            document = await resources(client)
            metrics = (await client.get("/metrics")).text
            series = await samples(client)
    assert document["probe"] is None
    assert document["absent"] == NVML_MISSING
    assert document["models"]["m"]["memory"] == {"gpu0": 4 * GiB}
    assert document["models"]["m"]["memory_held"] == {}
    gpu0 = next(view for view in document["devices"] if view["name"] == "gpu0")
    assert (gpu0["total"], gpu0["used"], gpu0["budget"]) == (None, None, None)
    # The families may be there, empty (HELP and TYPE lines), but not one sample.
    assert not [line for line in metrics.splitlines() if line.startswith("llamaswap_gpu_")]
    assert not [name for name, _, _ in series if name.startswith("llamaswap_gpu_")]
    assert not [labels for name, labels, _ in series if name == "llamaswap_model_memory_bytes"]


async def test_the_model_the_queue_loads_next_has_its_weights_read_ahead(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    weights = tmp_path / "b.gguf"
    weights.write_bytes(os.urandom(4 * 2**20))
    proxy = await proxy_factory(
        config(
            f"""
[models.a]
cmd = "${{fake}} --tokens-per-second 20"
[models.b]
cmd = "${{fake}}"
files = [{json.dumps(str(weights))}]
"""
        )
    )
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            assert (await client.post("/api/models/load/a")).status_code == 200
            # a serves a long answer (100 tokens at 20/s): b waits for it, next to load.
            long = partial(client.post, "/v1/chat/completions", json=chat("a", max_tokens=100))
            nursery.start_soon(long)
            # No event to wait on: poll until a's request is being served.
            while not (await client.get("/api/inflight")).json()["inflight"]:  # noqa: ASYNC110
                await trio.sleep(0.02)
            nursery.start_soon(partial(client.post, "/v1/chat/completions", json=chat("b")))
            await proxy.output.wait_for(r"prefetched 4 MiB of 'b''s weights in")
            nursery.cancel_scope.cancel()
