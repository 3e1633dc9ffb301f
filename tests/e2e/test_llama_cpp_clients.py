"""What llama-server's own clients send, through llamaswap (issue 31 §2): requests that
name no model (served by the default model), and llama.cpp's routes and the OpenAI
routes without ``/v1``. Real proxy, real fake model servers."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import LISTENING, REPO, running
from tests.e2e.test_proxy import config

ONE_MODEL = config('[models.only]\ncmd = "${fake}"\n')
MODELS = """
[models.alpha]
cmd = "${fake}"
aliases = ["gpt-4o-mini"]
[models.beta]
cmd = "${fake}"
"""
PROMPT = {"prompt": "hello", "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/completion", PROMPT),
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/chat/completions", CHAT),
        ("POST", "/completions", PROMPT),
        ("POST", "/v1/embeddings", {"input": "hello"}),
        ("POST", "/embeddings", {"input": "hello"}),
        ("GET", "/props", None),
        ("GET", "/slots", None),
    ],
)
async def test_with_one_model_a_request_naming_none_is_served_by_it(
    proxy_factory: StartProxy, method: str, path: str, body: object
) -> None:
    proxy = await proxy_factory(ONE_MODEL)
    async with proxy.client() as client:
        answer = await client.request(method, path, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llamaswap-upstream"] == "only"


async def test_with_several_models_the_default_serves_what_names_none(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config(MODELS, defaultModel="gpt-4o-mini"))
    async with proxy.client() as client:
        answer = await client.post("/chat/completions", json=CHAT)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-llamaswap-upstream"] == "alpha"  # the alias's model
        named = await client.post("/chat/completions", json={**CHAT, "model": "beta"})
        assert named.headers["x-llamaswap-upstream"] == "beta"
        props = await client.get("/props", params={"model": "beta"})
        assert props.json()["model"] == "beta"


async def test_with_several_models_and_no_default_the_400_says_how_to_set_one(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config(MODELS))
    async with proxy.client() as client:
        answer = await client.post("/completion", json=PROMPT)
        wrong_method = await client.delete("/props")
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("model", "invalid_request")
    assert "set defaultModel in the config" in error["message"]
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "GET, HEAD, POST"


async def test_the_answer_keeps_the_servers_name_and_says_its_reason(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(ONE_MODEL)
    async with proxy.client() as client:
        relayed = await client.post("/completion", json=PROMPT)
        own = await client.get("/no/such/route")
    # the fake server runs on hypercorn, and says so, as llama-server names itself
    assert relayed.headers.get_list("server") == ["hypercorn-h11"]
    assert (relayed.status_code, relayed.reason_phrase) == (200, "OK")
    assert "server" not in own.headers  # llamaswap's own answer names no server
    assert (own.status_code, own.reason_phrase) == (404, "Not Found")


async def test_a_request_that_may_not_load_its_model_gets_503_and_loads_nothing(
    proxy_factory: StartProxy,
) -> None:
    """Autoload control: ``?autoload=false``, ``X-LlamaSwap-Autoload: false``, and an
    ``/upstream`` path in ``upstream.ignorePaths`` (a web UI's files by default) never
    load a cold model; once it is loaded, they are served."""
    proxy = await proxy_factory(config(MODELS))
    async with proxy.client() as client:
        refused = [
            await client.post("/v1/completions?autoload=false", json={**PROMPT, "model": "beta"}),
            await client.post(
                "/v1/completions",
                json={**PROMPT, "model": "beta"},
                headers={"X-LlamaSwap-Autoload": "false"},
            ),
            await client.get("/upstream/beta/assets/app.js"),
            await client.get("/upstream/beta/favicon.ico"),
        ]
        for answer in refused:
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "model_not_loaded"
        assert "beta" not in await running(client)
        assert "beta" in refused[2].json()["error"]["message"]
        assert (await client.post("/api/models/load/beta")).status_code == 200
        served = await client.post("/v1/completions?autoload=0", json={**PROMPT, "model": "beta"})
        assert served.status_code == 200
        assert (await client.get("/upstream/beta/props")).status_code == 200  # not ignored


async def test_ignore_paths_are_the_configs(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config(MODELS + '[upstream]\nignorePaths = ["^/ws$"]\n'))
    async with proxy.client() as client:
        assert (await client.get("/upstream/alpha/ws")).status_code == 503
        assert "alpha" not in await running(client)
        # not ignored here: loaded for it (the fake server has no such file)
        assert (await client.get("/upstream/alpha/app.js")).status_code == 404
        assert "alpha" in await running(client)


def ipv6_loopback() -> bool:
    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError:
            return False
    return True


async def test_several_listen_addresses_are_each_served(proxy_factory: StartProxy) -> None:
    """``--listen`` more than once (IPv4 and IPv6 loopback where this machine has both):
    each is announced, and served."""
    second = "[::1]" if ipv6_loopback() else "127.0.0.1"
    args = ["--listen", "127.0.0.1:0", "--listen", f"{second}:0"]
    proxy = await proxy_factory(ONE_MODEL, args=args)
    urls = [match["url"] for line in proxy.output.lines if (match := LISTENING.search(line))]
    assert len(urls) == 2
    assert urls[0].startswith("http://127.0.0.1:")
    assert urls[1].startswith(f"http://{second}:")
    assert urls[0] != urls[1]
    for url in urls:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.post("/completion", json=PROMPT)).status_code == 200


async def test_llama_swaps_other_routes_reach_the_model_server(
    proxy_factory: StartProxy,
) -> None:
    """The versionless ``/v/...`` and ``/audioapi/...`` routes go to the model server
    without their prefix; the image servers' ``/sdapi/v1/...`` as they are."""
    proxy = await proxy_factory(config(MODELS))
    sent = [
        ("POST", "/v/chat/completions", {**CHAT, "model": "alpha"}, "/chat/completions"),
        ("POST", "/audioapi/v1/tasks/run", {"model": "alpha"}, "/v1/tasks/run"),
        ("POST", "/sdapi/v1/txt2img", {"model": "alpha", "prompt": "a cat"}, "/sdapi/v1/txt2img"),
        ("GET", "/sdapi/v1/loras?model=alpha", None, "/sdapi/v1/loras"),
    ]
    async with proxy.client() as client:
        for method, path, body, upstream in sent:
            mark = len(proxy.output.lines)
            answer = await client.request(method, path, json=body)
            assert answer.headers["x-llamaswap-upstream"] == "alpha", path
            with trio.fail_after(5):
                await proxy.output.wait_for(
                    rf"\[alpha\] .*request {method} {upstream} ", start=mark
                )


async def test_comfyui_is_reached_at_its_own_prefix_and_only_its_page_loads_it(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.comfyui_auto]\ncmd = "${fake}"\n'))
    async with proxy.client() as client:
        redirect = await client.get("/comfyui?x=1")
        assert (redirect.status_code, redirect.headers["location"]) == (301, "/comfyui/?x=1")
        stale = await client.get("/comfyui/api/queue")  # a tab left open: loads nothing
        assert stale.status_code == 503
        assert stale.json()["error"]["code"] == "model_not_loaded"
        assert "comfyui_auto" not in await running(client)
        page = await client.get("/comfyui/")  # the fake server has no page: its 404
        assert page.headers["x-llamaswap-upstream"] == "comfyui_auto"
        assert (await client.get("/comfyui/health")).json() == {"status": "ok"}


async def test_https_with_a_certificate_and_its_key(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    cert, key, ca = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    certificate.private_key_pem.write_to_path(str(key))
    certificate.cert_chain_pems[0].write_to_path(str(cert))
    authority.cert_pem.write_to_path(str(ca))
    proxy = await proxy_factory(ONE_MODEL, args=["--tls-cert", str(cert), "--tls-key", str(key)])
    assert proxy.url.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=str(ca))
    async with httpx.AsyncClient(base_url=proxy.url, verify=context) as client:
        answer = await client.post("/completion", json=PROMPT)
    assert answer.status_code == 200


def test_a_key_that_is_not_the_certificates_is_refused_before_serving(tmp_path: Path) -> None:
    authority = trustme.CA()
    one, other = authority.issue_cert("127.0.0.1"), authority.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    one.cert_chain_pems[0].write_to_path(str(cert))
    other.private_key_pem.write_to_path(str(key))
    config_file = tmp_path / "config.toml"
    config_file.write_text(ONE_MODEL)
    argv = [sys.executable, "-m", "llamaswap", "--config", str(config_file), "--listen",
            "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.startswith(f"llamaswap: cannot serve HTTPS with --tls-cert {cert}")
