"""Reloading the configuration of a running proxy (SPEC §3.7), through real HTTP."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import FAKE, free_port_base, running
from tests.e2e.test_live import LiveStream
from tests.e2e.test_operations import wait_for_request
from tests.e2e.test_proxy import chat

SIDE_BY_SIDE = """
[routing.router.settings.groups.all]
members = {members}
swap = false
exclusive = false
"""


def config(models: dict[str, str], *, ports: int, gamma_port: int = 0) -> str:
    """Models that run side by side from ``startPort = ports``; ``gamma`` on a port of
    its own, so that removing it shifts nobody's ``${PORT}``."""
    lines = [f"startPort = {ports}", "[macros]", f"fake = {json.dumps(FAKE)}"]
    for model_id, flags in models.items():
        lines.append(f"[models.{model_id}]")
        if model_id == "gamma":
            fake = FAKE.replace("${PORT}", str(gamma_port))
            lines += [
                f"cmd = {json.dumps(fake + flags)}",
                f'proxy = "http://127.0.0.1:{gamma_port}"',
            ]
        else:
            lines.append(f'cmd = "${{fake}}{flags}"')
    lines.append(SIDE_BY_SIDE.format(members=json.dumps(sorted(models))))
    return "\n".join(lines)


def rewrite(path: Path, text: str) -> None:
    """Save as editors do: a new file renamed over the old one."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


async def chat_status(client: httpx.AsyncClient, model: str) -> int:
    return (await client.post("/v1/chat/completions", json=chat(model))).status_code


async def pids(client: httpx.AsyncClient) -> dict[str, object]:
    return {model: entry["pid"] for model, entry in (await running(client)).items()}


async def test_a_reload_keeps_unchanged_models_and_applies_the_rest(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    ports, gamma_port = free_port_base(), free_port_base(1)
    before = {
        "alpha": "",  # unchanged: same process, serving throughout
        "beta": " --tokens-per-second 20",  # changed: restarts after its request
        "gamma": " --load-seconds 30",  # removed while a request waits for its load
    }
    proxy = await proxy_factory(config(before, ports=ports, gamma_port=gamma_port))
    outcomes: dict[str, object] = {}
    streaming, streamed = trio.Event(), trio.Event()
    async with proxy.client() as client:
        with trio.fail_after(60):
            for name in ("alpha", "beta"):
                assert (await client.post(f"/api/models/load/{name}")).status_code == 200
            old = await pids(client)

            async def stream(name: str, tokens: int) -> None:
                body = chat(name, stream=True, max_tokens=tokens)
                chunks = []
                async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
                    async for chunk in answer.aiter_bytes():
                        chunks.append(chunk)
                        streaming.set()
                text = b"".join(chunks)
                outcomes[name] = (answer.status_code, text.rstrip().endswith(b"data: [DONE]"))
                streamed.set()

            async def wait_for_gamma() -> None:
                answer = await client.post("/v1/chat/completions", json=chat("gamma"))
                outcomes["gamma"] = (answer.status_code, answer.json()["error"]["message"])

            mark = len(proxy.output.lines)
            nursery.start_soon(stream, "beta", 40)  # two seconds of streaming
            nursery.start_soon(wait_for_gamma)
            await proxy.output.wait_for(r"loading model 'gamma'", start=mark)
            await streaming.wait()

            after = {"alpha": "", "beta": " --tokens-per-second 40", "delta": ""}
            proxy.config.write_text(config(after, ports=ports, gamma_port=gamma_port))
            answer = await client.post("/api/config/reload")
            assert answer.status_code == 200, answer.text
            changed = answer.json()["changed"]
            assert changed["unchanged"] == ["alpha"]
            assert changed["restarted"] == ["beta"]
            assert changed["removed"] == ["gamma"]
            assert changed["added"] == ["delta"]

            served = await client.post("/v1/chat/completions", json=chat("alpha"))
            assert served.status_code == 200
            assert (
                await client.post("/v1/chat/completions", json=chat("delta"))
            ).status_code == 200
            await streamed.wait()
            served = await client.post("/v1/chat/completions", json=chat("beta"))
            assert served.status_code == 200
            new = await pids(client)
            models = {entry["id"] for entry in (await client.get("/v1/models")).json()["data"]}
    assert outcomes["beta"] == (200, True)  # no request lost to the restart
    assert outcomes["gamma"] == (
        503,
        "model 'gamma' was unloaded while the request waited (removed from the configuration)",
    )
    assert new["alpha"] == old["alpha"]
    assert new["beta"] != old["beta"]
    assert "gamma" not in new
    assert models == {"alpha", "beta", "delta"}
    text = proxy.output.text()
    assert "model 'alpha': stopping" not in text
    assert "model 'beta': stopping once its requests finish (its configuration changed)" in text


async def skip_to(stream: LiveStream, wanted: Callable[[str], bool]) -> str:
    """The first line ``wanted`` accepts (the stream must not end before it)."""
    while (line := await stream.next_line()) is not None:
        if wanted(line):
            return line
    raise AssertionError("the stream ended first")


def is_beta_log(line: str) -> bool:
    event = json.loads(line.removeprefix("data: "))
    return bool(event["type"] == "log" and event["model"] == "beta")


async def test_log_streams_open_across_a_reload_show_the_models_it_adds(
    proxy_factory: StartProxy,
) -> None:
    ports = free_port_base()
    proxy = await proxy_factory(config({"alpha": ""}, ports=ports))
    everything = await LiveStream.open(proxy.url, "/logs/stream?no-history")
    events = await LiveStream.open(proxy.url, "/api/events?logs=1")
    async with proxy.client() as client:
        with trio.fail_after(30):
            rewrite(proxy.config, config({"alpha": "", "beta": ""}, ports=ports))
            assert (await client.post("/api/config/reload")).json()["ok"]
            assert await chat_status(client, "beta") == 200
            await skip_to(everything, lambda line: line.startswith("[beta] "))
            await skip_to(events, lambda line: line.startswith("data: ") and is_beta_log(line))
    await everything.aclose()
    await events.aclose()


async def test_a_model_added_first_in_sorted_order_moves_no_other(
    proxy_factory: StartProxy,
) -> None:
    """``${PORT}`` goes in sorted model-ID order, yet a reload keeps each model's port:
    ``alpha`` is added, ``beta`` keeps its port and its process."""
    ports = free_port_base()
    proxy = await proxy_factory(config({"beta": "", "delta": ""}, ports=ports))
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert await chat_status(client, "beta") == 200
            before = await running(client)
            rewrite(proxy.config, config({"alpha": "", "beta": "", "delta": ""}, ports=ports))
            changed = (await client.post("/api/config/reload")).json()["changed"]
            assert (changed["added"], changed["restarted"]) == (["alpha"], [])
            assert await chat_status(client, "alpha") == 200
            after = await running(client)
    assert after["beta"]["pid"] == before["beta"]["pid"]
    assert after["beta"]["proxy"] == before["beta"]["proxy"]
    assert after["alpha"]["proxy"] not in (
        before["beta"]["proxy"],
        f"http://127.0.0.1:{ports + 1}",
    )


async def test_an_invalid_edit_changes_nothing(proxy_factory: StartProxy) -> None:
    ports = free_port_base()
    proxy = await proxy_factory(config({"alpha": ""}, ports=ports))
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            old = await pids(client)
            proxy.config.write_text(
                proxy.config.read_text() + '\n[models.beta]\ncmd = "x"\nttl = "soon"\nfoo = 1\n'
            )
            answer = await client.post("/api/config/reload")
            assert answer.status_code == 400
            document = answer.json()
            assert document["error"]["code"] == "invalid_request"
            assert document["ok"] is False
            problems = "\n".join(document["problems"])
            assert "models.beta.ttl" in problems
            assert "models.beta.foo" in problems
            metrics = (await client.get("/metrics")).text
            assert 'llamaswap_config_reloads_total{result="failed"} 1.0' in metrics
            assert 'llamaswap_config_reloads_total{result="ok"} 0.0' in metrics
            assert (
                await client.post("/v1/chat/completions", json=chat("alpha"))
            ).status_code == 200
            assert await pids(client) == old
            assert (
                await client.post("/v1/chat/completions", json=chat("beta"))
            ).status_code == 404
    assert "reload (api) failed; the running config stays" in proxy.output.text()


async def test_sighup_reloads_and_the_proxy_keeps_serving(proxy_factory: StartProxy) -> None:
    ports = free_port_base()
    proxy = await proxy_factory(config({"alpha": ""}, ports=ports))
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            old = await pids(client)
            rewrite(proxy.config, config({"alpha": "", "beta": ""}, ports=ports))
            events = await LiveStream.open(proxy.url, "/api/events")
            assert await events.next_line() == "event: snapshot"
            proxy.process.send_signal(signal.SIGHUP)
            while await events.next_line() != "event: reload":
                pass
            reload = json.loads((await events.next_line() or "").removeprefix("data: "))
            await events.aclose()
            assert reload["ok"] is True
            assert reload["trigger"] == "SIGHUP"
            assert reload["changed"]["added"] == ["beta"]
            assert (
                await client.post("/v1/chat/completions", json=chat("beta"))
            ).status_code == 200
            assert (await pids(client))["alpha"] == old["alpha"]
            metrics = (await client.get("/metrics")).text
            assert 'llamaswap_config_reloads_total{result="ok"} 1.0' in metrics
            assert "llamaswap_config_last_reload_success_timestamp_seconds 0.0" not in metrics
    assert await proxy.terminate() == 0


async def test_watch_config_applies_a_saved_edit(proxy_factory: StartProxy) -> None:
    ports = free_port_base()
    proxy = await proxy_factory(config({"alpha": ""}, ports=ports), args=["--watch-config"])
    async with proxy.client() as client:
        with trio.fail_after(30):
            await proxy.output.wait_for(r"watching .*: each saved change reloads it")
            mark = len(proxy.output.lines)
            rewrite(proxy.config, config({"alpha": "", "beta": ""}, ports=ports))
            started = trio.current_time()
            await proxy.output.wait_for(r"reloaded .* \(file changed\)", start=mark)
            took = trio.current_time() - started
            assert (
                await client.post("/v1/chat/completions", json=chat("beta"))
            ).status_code == 200
    print(f"--watch-config applied the edit {took:.2f} s after the rename")
    assert proxy.output.text().count("(file changed)") == 1  # one save, one reload
    assert "change detected" not in proxy.output.text()  # watchfiles' own lines: silenced


@pytest.mark.parametrize("edit", ["proxy", "filters"])
async def test_a_request_waiting_across_a_reload_goes_out_as_its_model_is_defined_now(
    edit: str, proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    """``a`` and ``b`` never run together; ``b`` waits while ``a`` streams, and a reload
    moves it to another port (as a ``${PORT}`` shift does) or changes its filters."""
    ports, old_port, new_port = free_port_base(), free_port_base(1), free_port_base(1)
    slow = json.dumps(FAKE + " --tokens-per-second 20")

    def models(port: int, filters: str = "") -> str:
        fake = json.dumps(FAKE.replace("${PORT}", str(port)))
        return (
            f"startPort = {ports}\n[models.a]\ncmd = {slow}\n"
            f'[models.b]\ncmd = {fake}\nproxy = "http://127.0.0.1:{port}"\n{filters}'
        )

    if edit == "proxy":
        edited, change = models(new_port), "restarted"
    else:
        edited, change = models(old_port, "filters.setParams = { max_tokens = 3 }"), "updated"
    proxy = await proxy_factory(models(old_port))
    answers: list[httpx.Response] = []
    answered = trio.Event()
    async with proxy.client() as client:
        with trio.fail_after(60):
            body = chat("a", stream=True, max_tokens=400)  # 20 s unless stopped
            async with client.stream("POST", "/v1/chat/completions", json=body) as busy:
                assert busy.status_code == 200

                async def waiting() -> None:
                    answer = await client.post(
                        "/v1/chat/completions", json=chat("b", max_tokens=8)
                    )
                    answers.append(answer)
                    answered.set()

                nursery.start_soon(waiting)
                await wait_for_request(client, "b", "queued")
                rewrite(proxy.config, edited)
                answer = await client.post("/api/config/reload")
                assert answer.json()["changed"][change] == ["b"], answer.text
            # Hung up: 'a' stops, and 'b' starts and answers.
            await answered.wait()
            b = (await running(client))["b"]
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "b"
    assert b["proxy"] == f"http://127.0.0.1:{new_port if edit == 'proxy' else old_port}"
    assert answer.json()["usage"]["completion_tokens"] == (3 if edit == "filters" else 8)


async def test_switching_schedulers_during_a_load_lets_it_finish(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    """fifo → serial → fifo while 'a' loads for a request and others wait: the new
    scheduler neither evicts 'a' mid-load nor starts another model beside it."""
    base = f"startPort = {free_port_base()}\n[macros]\nfake = {json.dumps(FAKE)}\n"
    models = '[models.a]\ncmd = "${fake} --load-seconds 2"\n'
    models += '[models.b]\ncmd = "${fake}"\n[models.c]\ncmd = "${fake}"\n'  # one at a time
    serial = '[routing.scheduler]\nuse = "serial"\n'
    proxy = await proxy_factory(base + models)
    answers: dict[str, httpx.Response] = {}
    async with proxy.client() as client:
        with trio.fail_after(60):
            async with trio.open_nursery() as requests:

                async def ask(model: str) -> None:
                    answers[model] = await client.post("/v1/chat/completions", json=chat(model))

                requests.start_soon(ask, "a")
                await wait_for_request(client, "a", "loading")
                for model in ("b", "c"):
                    requests.start_soon(ask, model)
                    await wait_for_request(client, model, "queued")
                for text in (base + serial + models, base + models):
                    rewrite(proxy.config, text)
                    assert (await client.post("/api/config/reload")).status_code == 200
    assert {model: answer.status_code for model, answer in answers.items()} == {
        "a": 200,
        "b": 200,
        "c": 200,
    }
    text = proxy.output.text()
    assert text.count("scheduler 'serial' replaces 'fifo'") == 1
    assert "evicted for" not in text.split("model 'a': ready")[0]  # nothing cut a's load


def unstarted(*models: str) -> str:
    """Models that are listed but never started here: no model port is needed."""
    return "".join(
        f'[models.{model}]\ncmd = "never-started"\nproxy = "http://127.0.0.1:9"\n'
        for model in models
    )


async def listed(client: httpx.AsyncClient) -> list[str]:
    return sorted(entry["id"] for entry in (await client.get("/v1/models")).json()["data"])


async def test_watch_config_reloads_a_truncated_then_written_file_once_complete(
    proxy_factory: StartProxy,
) -> None:
    """A writer that truncates the file, then writes it: the watch reloaded the empty file
    first, which removed every model (4 of 5 waiting requests failed with 503)."""
    proxy = await proxy_factory(unstarted("alpha"), args=["--watch-config"])
    async with proxy.client() as client:
        with trio.fail_after(30):
            await proxy.output.wait_for(r"watching .*: each saved change reloads it")
            mark = len(proxy.output.lines)
            with proxy.config.open("w") as file:  # truncated: empty on disk
                file.flush()
                await trio.sleep(0.25)  # the writer is slow to write (not waiting on llamaswap)
                file.write(unstarted("alpha", "beta"))
            line = (await proxy.output.wait_for(r"reloaded .* \(file changed\).*", start=mark))[0]
            assert "removed" not in line
            assert line.endswith(": added 'beta'")
            assert await listed(client) == ["alpha", "beta"]


async def test_a_file_left_empty_is_refused_until_it_says_there_are_no_models(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(unstarted("alpha"), args=["--watch-config"])
    async with proxy.client() as client:
        with trio.fail_after(30):
            await proxy.output.wait_for(r"watching .*: each saved change reloads it")
            mark = len(proxy.output.lines)
            proxy.config.write_text("")
            await proxy.output.wait_for(r"reload \(file changed\) failed", start=mark)
            answer = await client.post("/api/config/reload")
            assert answer.status_code == 400
            (problem,) = answer.json()["problems"]
            assert problem == (
                f"{proxy.config}: models: the file defines no model and has no [models] "
                "table, so it would remove every model ('alpha'); if it was saved "
                "half-written, save it again; to remove every model, write [models] with "
                "nothing under it"
            )
            assert await listed(client) == ["alpha"]
            mark = len(proxy.output.lines)
            proxy.config.write_text("[models]\n")
            line = (await proxy.output.wait_for(r"reloaded .* \(file changed\).*", start=mark))[0]
            assert line.endswith(": removed 'alpha'")
            assert await listed(client) == []


async def test_a_config_directory_is_merged_and_watched(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    """``--config DIR``: its ``*.toml`` files merged; with ``--watch-config``, a file
    saved in it (a new one too) reloads the whole."""
    folder = tmp_path / "conf.d"
    folder.mkdir()
    (folder / "a.toml").write_text(unstarted("alpha"))
    args = ["--config", str(folder), "--watch-config"]  # the last --config counts
    proxy = await proxy_factory(unstarted("unused"), args=args)
    async with proxy.client() as client:
        with trio.fail_after(30):
            await proxy.output.wait_for(r"watching .*conf\.d: each saved change reloads it")
            assert await listed(client) == ["alpha"]
            mark = len(proxy.output.lines)
            rewrite(folder / "b.toml", unstarted("beta"))
            await proxy.output.wait_for(r"reloaded .* \(file changed\)", start=mark)
            assert await listed(client) == ["alpha", "beta"]
