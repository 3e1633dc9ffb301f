"""docs/migrating.md's walk-through, run as written: its YAML is the example's, the TOML
``import-config`` writes is the one the page shows, and llamaswap started on it answers
the page's requests with the page's answers (timestamps, PIDs, ports and timings aside).
The page is read here, so the page and what the commands do cannot drift apart."""

from __future__ import annotations

import json
import re
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import REPO, child_env, free_port_base

DOC = REPO / "docs" / "migrating.md"
EXAMPLE = "examples/migrating/llama-swap.yaml"
HEADING = "## A walk-through: one llama-swap config to a running llamaswap"
#: What differs from one run to the next, in an answer.
VOLATILE = {"created", "timings", "pid", "proxy"}
#: The same, in a log line: its time stamp, PIDs and ports, each with what matches any.
_LOG_VOLATILE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})|(pid \d+)|(:\d+\b)")
_ANY = (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", r"pid \d+", r":\d+\b")


def walkthrough_blocks() -> list[tuple[str, str]]:
    """The fenced blocks of the walk-through section, as (language, text)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(HEADING)
    end = text.index("\n## ", start + len(HEADING))
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", text[start:end], re.MULTILINE | re.DOTALL)
    return [(language, body.rstrip("\n")) for language, body in blocks]


def log_pattern(line: str) -> str:
    """A regular expression for a log line the page shows, whatever its run's time stamp,
    PIDs and ports."""
    pattern, end = "", 0
    for match in _LOG_VOLATILE.finditer(line):
        group = match.lastindex or 1  # the one group that matched
        pattern += re.escape(line[end : match.start()]) + _ANY[group - 1]
        end = match.end()
    return pattern + re.escape(line[end:])


def steady(value: Any) -> Any:
    """``value`` with what differs between runs (``VOLATILE``) replaced by a marker."""
    if isinstance(value, dict):
        return {k: "<varies>" if k in VOLATILE else steady(v) for k, v in value.items()}
    if isinstance(value, list):
        return [steady(item) for item in value]
    return value


def curl_request(command: str) -> tuple[str, str, dict[str, str], bytes]:
    """Method, path, headers and body of a ``curl -s localhost:8080/...`` line of the page,
    as curl sends them (``-d`` posts a URL-encoded form unless a header says otherwise)."""
    words = shlex.split(command)
    assert words[:2] == ["curl", "-s"], command
    path, headers, data = "", {}, []
    rest = iter(words[2:])
    for word in rest:
        if word == "-H":
            name, _, value = next(rest).partition(":")
            headers[name.strip()] = value.strip()
        elif word == "-d":
            data.append(next(rest))
        else:
            assert word.startswith("localhost:8080/"), word
            path = word.removeprefix("localhost:8080")
    if data and not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    return ("POST" if data else "GET"), path, headers, "&".join(data).encode()


async def test_the_walkthrough_runs_as_the_page_says(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    blocks = walkthrough_blocks()
    languages = [language for language, _ in blocks]
    assert languages[:3] == ["yaml", "console", "toml"], languages
    (_, yaml), (_, imported), (_, toml), *sessions = blocks

    # The YAML shown is the example's.
    assert yaml == (REPO / EXAMPLE).read_text(encoding="utf-8").rstrip("\n")

    # import-config, run as the page runs it, prints what the page shows and writes its TOML.
    command, *said = imported.splitlines()
    assert command.startswith("$ llamaswap import-config ")
    (tmp_path / EXAMPLE).parent.mkdir(parents=True)
    (tmp_path / EXAMPLE).write_text(yaml + "\n", encoding="utf-8")
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, "-m", "llamaswap", *shlex.split(command)[2:]],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=tmp_path,
            env=child_env(uuid.uuid4().hex),
        )
    assert result.returncode == 0, result.stderr
    assert result.stderr.decode().splitlines() == said
    written = (tmp_path / "config.toml").read_text(encoding="utf-8")
    assert written.rstrip("\n") == toml

    # llamaswap on it: on a free port and free model ports (the page's are fixed).
    start, *requests, log = [text for _, text in sessions]
    assert start.splitlines()[0] == "$ llamaswap --config config.toml"
    assert "\nstartPort = 10001\n" in written
    config = written.replace("\nstartPort = 10001\n", f"\nstartPort = {free_port_base()}\n")
    proxy = await proxy_factory(config, log_level="info")
    async with proxy.client() as client:
        with trio.fail_after(30):
            for line in start.splitlines()[1:]:
                await proxy.output.wait_for(log_pattern(line))
            for block in requests:
                command, answer = block.splitlines()
                method, path, headers, body = curl_request(command.removeprefix("$ "))
                response = await client.request(method, path, headers=headers, content=body)
                assert steady(response.json()) == steady(json.loads(answer)), command
            for line in log.splitlines():
                await proxy.output.wait_for(log_pattern(line))


def test_a_log_line_matches_whatever_its_time_pid_and_port() -> None:
    pattern = log_pattern("2026-12-05 09:09:27,943 INFO m: model 'x': started pid 20406")
    assert re.search(pattern, "2027-01-01 10:00:00,001 INFO m: model 'x': started pid 7")
    assert not re.search(pattern, "2027-01-01 10:00:00,001 INFO m: model 'y': started pid 7")
    url = log_pattern("llamaswap: listening on http://127.0.0.1:8080")
    assert re.search(url, "llamaswap: listening on http://127.0.0.1:41234")
    assert not re.search(url, "llamaswap: listening on http://127.0.0.2:41234")
