"""Every example config is valid, and the quickstart does what README.md says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import REPO, ProxyProcess, free_port_base
from tests.e2e.test_proxy import chat

#: Workloads (``*.workload.toml``) are not configs: tests/unit/test_simulate.py runs them.
EXAMPLES = sorted(
    p for p in (REPO / "examples").rglob("*.toml") if not p.name.endswith(".workload.toml")
)


def llamaswap(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI and capture what it prints."""
    return subprocess.run(
        [sys.executable, "-m", "llamaswap", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_example_passes_check_config(path: Path) -> None:
    result = llamaswap("check-config", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{path}: ok"


def test_check_config_reports_every_problem_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "healthCheckTimout = 30\n"
        "[models.chat]\ncmd = 'llama-server --port ${PORT}'\nttl = 'five minutes'\n"
        "[routing.scheduler]\nuse = 'seriel'\n"
    )
    result = llamaswap("check-config", str(bad))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    typo = "unknown key 'healthCheckTimout'; did you mean 'healthCheckTimeout'? this table's"
    assert any(line.startswith(f"{bad}: healthCheckTimout: {typo}") for line in lines)
    assert any(line.startswith(f"{bad}: models.chat.ttl: ") for line in lines)
    assert any(
        line.startswith(f"{bad}: routing.scheduler.use: ") and "did you mean 'serial'" in line
        for line in lines
    )
    assert lines[-1] == "3 problems found"


HOSTILE = {
    "nested": "a = " + "[" * 500 + "]" * 500,
    "dotted_key": ".".join(["a"] * 1000) + " = 1",
    "long_integer": "startPort = " + "1" * 5000,
    "parentheses": (
        "[models.a]\ncmd = 's --port ${PORT}'\n[routing.router.settings.matrix]\n"
        "vars = {a = 'a'}\nsets = {s = '" + "(" * 3000 + "a" + ")" * 3000 + "'}"
    ),
    "macro_bomb": "\n".join(
        ["[macros]", 'm0 = "' + "x" * 16 + '"']
        + [f'm{i} = "${{m{i - 1}}}${{m{i - 1}}}"' for i in range(1, 40)]
        + ["[models.a]", 'cmd = "s --port ${PORT} ${m39}"']
    ),
    "aging_overflow": "[routing.scheduler.settings.serial]\nagingDivisor = 1e300",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_check_config_on_hostile_input_is_one_problem_and_exit_2(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / f"{name}.toml"
    path.write_text(HOSTILE[name] + "\n")
    result = llamaswap("check-config", str(path))
    assert "Traceback" not in result.stderr
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == "1 problem found"
    assert result.stderr.startswith(f"{path}")


def test_a_config_check_config_refuses_does_not_start_the_server(tmp_path: Path) -> None:
    path = tmp_path / "aging.toml"
    path.write_text(HOSTILE["aging_overflow"] + "\n")
    result = llamaswap("--config", str(path), "--listen", "127.0.0.1:0")
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    assert "routing.scheduler.settings.serial.agingDivisor: expected 0 (no aging)" in result.stderr


def example(name: str) -> str:
    """``examples/NAME``'s text, on free ports."""
    text = (REPO / "examples" / name).read_text()
    return re.sub(r"(?m)^startPort = \d+$", f"startPort = {free_port_base()}", text)


async def test_quickstart_serves_two_models_with_a_swap(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(example("quickstart.toml"))
    messages = [{"role": "user", "content": "hello"}]
    async with proxy.client() as client:
        with trio.fail_after(60):
            listed = (await client.get("/v1/models")).json()["data"]
            assert {m["id"] for m in listed} == {"chat", "coder", "embed"}
            first = await client.post(
                "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": messages}
            )
            assert first.json()["model"] == "chat"
            embedding = await client.post("/v1/embeddings", json={"model": "embed", "input": "x"})
            assert embedding.status_code == 200
            second = await client.post(
                "/v1/chat/completions", json={"model": "coder", "messages": messages}
            )
            assert second.json()["model"] == "coder"
            running = {e["model"] for e in (await client.get("/running")).json()["running"]}
            assert running == {"coder", "embed"}  # chat swapped out, embed persists
    await proxy.output.wait_for(r"model 'chat': stopping \(evicted for 'coder'\)")


async def admit(
    proxy: ProxyProcess,
    client: httpx.AsyncClient,
    nursery: trio.Nursery,
    band: str,
    answered: list[str],
) -> None:
    """Send ``chat`` a request in ``band``; return once the proxy has it (queued, or loading
    the model for it); ``answered`` gets the band when the answer is complete."""
    mark = len(proxy.output.lines)

    async def send() -> None:
        headers = {"X-LlamaSwap-Priority": band}
        response = await client.post("/v1/chat/completions", json=chat("chat"), headers=headers)
        assert response.status_code == 200, response.text
        answered.append(band)

    nursery.start_soon(send)
    await proxy.output.wait_for(r"request #\d+ for 'chat': (queued|loading)$", start=mark)


async def test_quickstart_serves_one_per_band_interactive_first(
    proxy_factory: StartProxy,
) -> None:
    """The dashboard Playground's "Send one per band", as README.md and docs/ui.md say:
    batch, normal and interactive at once, in that order, to a model not yet loaded."""
    proxy = await proxy_factory(example("quickstart.toml"))
    answered: list[str] = []
    async with proxy.client() as client, trio.open_nursery() as requests:
        with trio.fail_after(60):
            for band in ("batch", "normal", "interactive"):
                await admit(proxy, client, requests, band, answered)
    # batch took the slot and chat's load; interactive paused it once chat was ready.
    assert answered == ["interactive", "normal", "batch"]
    async with proxy.client() as client:
        activity = (await client.get("/api/activity")).json()["activity"]
    assert {record["scheduler"] for record in activity} == {"serial"}
    assert all(record["score"] is not None for record in activity)  # the dashboard shows it
    (batch,) = (record for record in activity if record["band"] == "batch")
    assert batch["metadata"]["preemptions"] == 1
    assert "prefill_ignored" not in batch["metadata"]


async def test_the_memory_example_runs_what_fits_and_evicts_to_make_room(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(example("memory.toml"))
    async with proxy.client() as client:

        async def running() -> set[str]:
            return {e["model"] for e in (await client.get("/running")).json()["running"]}

        with trio.fail_after(60):
            for model in ("chat", "embed", "coder"):
                loaded = await client.post(f"/api/models/load/{model}")
                assert loaded.status_code == 200, loaded.text
            assert await running() == {"chat", "embed", "coder"}  # 22 GiB of 23.5
            assert (await client.post("/api/models/load/big")).status_code == 200
            assert await running() == {"big", "embed"}
    await proxy.output.wait_for(
        r"loading model 'big' \(needs 20 GiB on gpu0, declared\), evicting \['chat', 'coder'\]"
    )
