"""The web dashboard (``/ui/``) in a real browser, against a real llamaswap with fake models.

Headless Chromium driven by Playwright's sync API. Each test starts the proxy on the Trio
side (``proxy_factory``: the real CLI, real fake-server processes), then runs its browser
part in one worker thread (``in_browser``), where Playwright's sync API lives; when the
browser part needs a client to act at a given moment it calls back into Trio
(``trio.from_thread.run``). Every wait in the browser is an auto-waiting ``expect(...)``
with an explicit timeout, never a sleep.

The browser is Debian's ``chromium`` (``apt-get install -y chromium``, which
``./scripts/check`` runs when it can); Playwright's own browser download is not used.
Without Playwright or without Chromium the browser tests skip, saying which is missing.

``test_screenshots`` (and the preemption test, its ``queue-paused.png``) write their pictures
to a temporary directory, or to the directory named by ``$LLAMASWAP_UI_SCREENSHOTS``
(``docs/img`` refreshes the documentation's).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, final

import httpx
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import REPO, running
from tests.e2e.test_operations import cancelled_error, inflight
from tests.e2e.test_proxy import chat, config

with contextlib.suppress(ImportError):  # without it the browser tests skip, saying why
    from playwright.sync_api import Locator, Page, Route, expect, sync_playwright

pytestmark = pytest.mark.ui

T = TypeVar("T")

CHROMIUM = Path(os.environ.get("LLAMASWAP_CHROMIUM", "/usr/bin/chromium"))
UI_FILES = REPO / "llamaswap" / "ui"
#: Milliseconds any one expectation may take: generous, for a loaded two-core machine.
WAIT = 15_000
PRIORITY = "X-LlamaSwap-Priority"


def _browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed: pip install -e '.[test]'"
    if not os.access(CHROMIUM, os.X_OK):
        return (
            f"no Chromium at {CHROMIUM}: apt-get install -y chromium (./scripts/check does "
            "it when run as root), or point LLAMASWAP_CHROMIUM at a Chromium binary"
        )
    return None


BROWSER_MISSING = _browser_missing()
needs_browser = pytest.mark.skipif(BROWSER_MISSING is not None, reason=BROWSER_MISSING or "")

MODELS = config(
    """
[models.alpha]
cmd = "${fake} --load-seconds 1 --tokens-per-second 10"
name = "Alpha (fake)"
ttl = 300
[models.beta]
cmd = "${fake}"
[models.slow]
cmd = "${fake} --load-seconds 60"
"""
)

SERIAL = config(
    """
[models.alpha]
cmd = "${fake} --tokens-per-second 10"
[routing.scheduler]
use = "serial"
"""
)


# ------------------------------------------------------------------ the browser side


@final
class Tab:
    """One page of the dashboard, and every error its console reported."""

    def __init__(self, page: Page, url: str) -> None:
        self.page = page
        self.url = url
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def open(self) -> None:
        """Load the dashboard and wait for its event stream to be live."""
        self.page.goto(f"{self.url}/ui/")
        expect(self.page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT)

    def model(self, name: str) -> Locator:
        return self.page.get_by_role("article", name=f"Model {name}")

    def headings(self) -> list[str]:
        """The activity table's column IDs, left to right."""
        ids: list[str] = self.page.locator("#activity thead th").evaluate_all(
            "ths => ths.map(th => th.dataset.column)"
        )
        return ids

    def column(self, column: str) -> Locator:
        """The activity table's cells in ``column`` (by its ID), top to bottom."""
        index = self.headings().index(column) + 1
        return self.page.locator(f"#activity tbody tr td:nth-child({index})")


def _run_in_browser(url: str, body: Callable[[Tab], T], width: int, color_scheme: str) -> T:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), timeout=60_000)
        try:
            context = browser.new_context(
                viewport={"width": width, "height": 900},
                color_scheme="dark" if color_scheme == "dark" else "light",
            )
            page = context.new_page()
            page.set_default_timeout(WAIT)
            return body(Tab(page, url))
        finally:
            browser.close()


async def in_browser(
    url: str,
    body: Callable[[Tab], T],
    *,
    width: int = 1280,
    color_scheme: str = "light",
) -> T:
    """Run ``body`` with a fresh browser on a worker thread (Playwright's sync API)."""
    run = partial(_run_in_browser, url, body, width, color_scheme)
    return await trio.to_thread.run_sync(run)


def state_of(card: Locator) -> Locator:
    return card.locator('[data-role="state"]')


# ------------------------------------------------------------------- the Trio side


async def new_request(client: httpx.AsyncClient, known: set[int], state: str) -> int:
    """The ID of a request not in ``known`` once it is in ``state`` (polls /api/inflight,
    bounded by the caller's ``fail_after``: there is no event to wait on from outside)."""
    while True:
        for entry in await inflight(client):
            if entry["id"] not in known and entry["state"] == state:
                known.add(entry["id"])
                return int(entry["id"])
        await trio.sleep(0.02)


def blocking(function: Callable[..., Awaitable[T]], *args: Any) -> T:
    """From the browser's thread: run ``function(*args)`` in Trio and wait for it."""
    return trio.from_thread.run(function, *args)


# ------------------------------------------------------------------------- tests


async def test_the_files_are_served_without_a_key_and_nothing_else_is(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.beta]\ncmd = "${fake}"', apiKeys=["sk-ui-1"]))
    async with proxy.client() as client:
        moved = await client.get("/ui")
        assert (moved.status_code, moved.headers["location"]) == (308, "ui/")
        index = await client.get("/ui/")
        assert index.status_code == 200
        assert index.headers["content-type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in index.headers["content-security-policy"]
        assert index.headers["cache-control"] == "no-cache"
        assert '<script type="module" src="js/app.js">' in index.text
        script = await client.get("/ui/js/app.js")
        assert (script.status_code, script.headers["content-type"]) == (
            200,
            "text/javascript; charset=utf-8",
        )
        assert (await client.get("/ui/style.css")).status_code == 200
        assert (await client.get("/ui/missing.js")).status_code == 404
        assert (await client.get("/ui/js")).status_code == 404  # a directory, or any other type
        for path in ("/api/events", "/v1/models", "/logs", "/api/activity", "/uix"):
            refused = await client.get(path)
            assert refused.status_code == 401, path
        key = {"Authorization": "Bearer sk-ui-1"}
        assert (await client.get("/v1/models", headers=key)).status_code == 200
        for path in ("/", "/upstream"):  # llama-swap's ways to its dashboard
            moved = await client.get(path)
            assert (moved.status_code, moved.headers["location"]) == (302, "ui/"), path


def test_the_whole_page_is_small() -> None:
    files = [path for path in UI_FILES.rglob("*") if path.is_file()]
    assert {path.suffix for path in files} <= {".html", ".js", ".css", ".svg"}
    assert sum(path.stat().st_size for path in files) < 200_000


def screenshots(tmp_path: Path) -> Path:
    """Where a test's pictures for the docs go: ``$LLAMASWAP_UI_SCREENSHOTS`` (``docs/img``
    refreshes the documentation's), else the test's own directory."""
    return Path(os.environ.get("LLAMASWAP_UI_SCREENSHOTS", tmp_path))


@needs_browser
async def test_the_page_loads_live_with_no_console_error(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)

    def body(tab: Tab) -> None:
        page = tab.page
        page.goto(f"{tab.url}/ui")  # redirected to /ui/
        assert page.url == f"{tab.url}/ui/"
        expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT)
        cards = page.locator("#models article")
        expect(cards.locator(".model-name")).to_have_text(["alpha", "beta", "slow"], timeout=WAIT)
        for name in ("alpha", "beta", "slow"):
            expect(state_of(tab.model(name))).to_have_text("stopped", timeout=WAIT)
        expect(tab.model("alpha").locator(".model-title")).to_have_text("Alpha (fake)")
        expect(page.locator("#sched")).to_have_text("scheduler: fifo", timeout=WAIT)
        expect(page.locator("#version")).to_contain_text("llamaswap ", timeout=WAIT)
        expect(page.locator("#bands tbody tr")).to_have_count(5, timeout=WAIT)
        # Keyboard: the tabs move with the arrow keys.
        page.get_by_role("tab", name="Activity").focus()
        page.keyboard.press("ArrowRight")
        expect(page.get_by_role("tab", name="Logs")).to_be_focused(timeout=WAIT)
        expect(page.get_by_role("tab", name="Logs")).to_have_attribute("aria-selected", "true")
        expect(page.locator("#logs-panel")).to_be_visible(timeout=WAIT)
        expect(page.locator("#activity-panel")).to_be_hidden(timeout=WAIT)
        expect(page.locator("#log")).to_contain_text("Running on http://", timeout=WAIT)
        assert tab.errors == []

    await in_browser(proxy.url, body)


@needs_browser
async def test_durations_change_unit_after_rounding(proxy_factory: StartProxy) -> None:
    """format.js, in the page: 999.6 ms is "1.00 s" (it said "1000 ms"), and likewise at
    the next boundaries."""
    proxy = await proxy_factory(config('[models.beta]\ncmd = "${fake}"'))
    durations = [999.4, 999.6, 9994, 9996, 59_949, 59_960, 61_000]

    def body(tab: Tab) -> object:
        tab.open()
        return tab.page.evaluate(
            """async (durations) => {
                const fmt = await import(new URL("js/format.js", document.baseURI).href);
                return durations.map(fmt.duration);
            }""",
            durations,
        )

    shown = await in_browser(proxy.url, body)
    assert shown == ["999 ms", "1.00 s", "9.99 s", "10.0 s", "59.9 s", "1m 00s", "1m 01s"]


@needs_browser
async def test_counts_are_singular_for_one_and_plural_otherwise(proxy_factory: StartProxy) -> None:
    """format.js's plural, which every count on the page uses (it said "1 lines",
    "2 problem(s)", "(1 request(s))")."""
    proxy = await proxy_factory(config('[models.beta]\ncmd = "${fake}"'))

    def body(tab: Tab) -> object:
        tab.open()
        page = tab.page
        page.get_by_role("tab", name="Logs").click()
        page.get_by_label("Search").fill("Running on http://")
        expect(page.locator("#logs-count")).to_have_text(
            re.compile(r"^1 matching of \d+ lines$"), timeout=WAIT
        )
        return page.evaluate(
            """async () => {
                const fmt = await import(new URL("js/format.js", document.baseURI).href);
                const counts = [0, 1, 2].map((n) => fmt.plural(n, "line"));
                return counts.concat([1, 3].map((n) => fmt.plural(n, "entry", "entries")));
            }"""
        )

    shown = await in_browser(proxy.url, body)
    assert shown == ["0 lines", "1 line", "2 lines", "1 entry", "3 entries"]


@needs_browser
async def test_load_unload_and_cancel_a_load_from_the_page(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:

        def body(tab: Tab) -> None:
            tab.open()
            page = tab.page
            page.evaluate("window.sameDocument = true")  # gone if the page reloaded
            alpha = tab.model("alpha")
            alpha.get_by_role("button", name="Load alpha", exact=True).click()
            expect(state_of(alpha)).to_have_text("starting", timeout=WAIT)
            expect(alpha.get_by_role("button", name="Load alpha", exact=True)).to_be_disabled()
            expect(state_of(alpha)).to_have_text("ready", timeout=WAIT)
            pid = alpha.locator('[data-role="pid"]')
            expect(pid).to_have_text(re.compile(r"^\d+$"), timeout=WAIT)
            # --load-seconds 1: starting → ready took a second or more.
            took = alpha.locator('[data-role="took"]')
            expect(took).to_have_text(re.compile(r"^[1-9]\.\d\d s$"), timeout=WAIT)
            expect(alpha.locator('[data-role="ttl"]')).to_have_text(
                re.compile(r"^[45]m \d\ds$"), timeout=WAIT
            )
            assert blocking(running, client)["alpha"]["pid"] == int(pid.inner_text())

            alpha.get_by_role("button", name="Unload alpha").click()
            expect(state_of(alpha)).to_have_text("stopped", timeout=WAIT)
            expect(pid).to_have_text("—", timeout=WAIT)
            assert blocking(running, client) == {}

            slow = tab.model("slow")  # --load-seconds 60
            cancel = slow.get_by_role("button", name="Cancel load of slow")
            expect(cancel).to_be_hidden(timeout=WAIT)
            slow.get_by_role("button", name="Load slow", exact=True).click()
            expect(state_of(slow)).to_have_text("starting", timeout=WAIT)
            # Its process runs from the start of the load: its PID shows while it starts.
            slow_pid = slow.locator('[data-role="pid"]')
            expect(slow_pid).to_have_text(re.compile(r"^\d+$"), timeout=WAIT)
            assert blocking(running, client)["slow"]["pid"] == int(slow_pid.inner_text())
            cancel.click()
            expect(state_of(slow)).to_have_text("stopped", timeout=WAIT)
            # The page's load has its answer (a 499) once Load is offered again.
            expect(slow.get_by_role("button", name="Load slow", exact=True)).to_be_enabled()
            # One toast for one click: not also "Load of slow ended: ... was cancelled".
            toasts = page.locator("#toasts .toast", has_text="slow")
            expect(toasts.locator(".toast-text")).to_have_text(
                ["Cancelled the load of slow (1 request)"]
            )
            # A toast can be closed, with the keyboard too.
            toasts.get_by_role("button", name="Dismiss").focus()
            page.keyboard.press("Enter")
            expect(toasts).to_have_count(0)
            assert page.evaluate("window.sameDocument") is True
            # The page's own load request was the one cancelled: its 499 is logged.
            assert all("status of 499" in error for error in tab.errors), tab.errors

        await in_browser(proxy.url, body)
        assert await running(client) == {}
        assert "model 'slow': stopped" in proxy.output.text()


@needs_browser
async def test_a_model_that_fails_to_start_shows_failed_with_why_until_its_next_start(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    proxy = await proxy_factory(
        config(
            '[models.broken]\ncmd = "${fake} --load-seconds 0.5 --fail-start"\n'
            '[models.beta]\ncmd = "${fake}"'
        )
    )

    def body(tab: Tab) -> None:
        tab.open()
        page = tab.page
        broken = tab.model("broken")
        failure = broken.locator('[data-role="failure"]')
        expect(failure).to_be_hidden()
        broken.get_by_role("button", name="Load broken", exact=True).click()
        expect(state_of(broken)).to_have_text("failed", timeout=WAIT)
        reason = broken.locator('[data-role="reason"]')
        expect(reason).to_have_text("Start failed: exited with status 1 while starting")
        expect(reason).to_have_attribute("title", re.compile(r"^model 'broken' failed to start"))
        output = broken.get_by_label("Last output of broken")
        expect(output).to_contain_text("error: failed to load model file 'broken.gguf'")
        # Nothing runs: it can be loaded again, not unloaded.
        expect(broken.get_by_role("button", name="Load broken", exact=True)).to_be_enabled()
        expect(broken.get_by_role("button", name="Unload broken")).to_be_disabled()
        expect(state_of(tab.model("beta"))).to_have_text("stopped")  # not failed: never tried
        page.locator("#models-panel").screenshot(
            path=screenshots(tmp_path) / "model-failed.png", animations="disabled"
        )
        # Its next start ends it: starting, without the failure, until it fails again.
        broken.get_by_role("button", name="Load broken", exact=True).click()
        expect(state_of(broken)).to_have_text("starting", timeout=WAIT)
        expect(failure).to_be_hidden()
        expect(state_of(broken)).to_have_text("failed", timeout=WAIT)
        expect(failure).to_be_visible()
        # The page's own loads got the 502 (the browser logs a failed fetch).
        assert tab.errors
        assert all("status of 502" in error for error in tab.errors), tab.errors

    await in_browser(proxy.url, body)


@needs_browser
async def test_the_queue_in_score_order_and_cancel_from_the_page(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(SERIAL)
    answers: dict[str, httpx.Response] = {}
    answered = {name: trio.Event() for name in ("holder", "batch", "normal", "interactive")}
    ids: dict[str, int] = {}
    async with proxy.client() as client, trio.open_nursery() as nursery:

        async def send(name: str, priority: str, max_tokens: int) -> None:
            body = chat("alpha", max_tokens=max_tokens)
            headers = {PRIORITY: priority}
            answers[name] = await client.post("/v1/chat/completions", json=body, headers=headers)
            answered[name].set()

        with trio.fail_after(30):
            known: set[int] = set()
            nursery.start_soon(send, "holder", "normal", 600)  # a minute at 10 tokens/s
            ids["holder"] = await new_request(client, known, "serving")
            for band in ("batch", "normal", "interactive"):  # the worst first
                nursery.start_soon(send, band, band, 1)
                ids[band] = await new_request(client, known, "queued")

        def body(tab: Tab) -> None:
            tab.open()
            page = tab.page
            waiting = page.locator("#waiting tbody tr")
            first_served_first = [f"#{ids[band]} alpha" for band in ("interactive", "normal")]
            first_served_first.append(f"#{ids['batch']} alpha")
            expect(waiting.locator("td:nth-child(2)")).to_have_text(
                first_served_first, timeout=WAIT
            )
            # score = priority + affinity (alpha is loaded) + a little aging
            scores = [r"^1[01]\d\.\d$", r"^1?\d\.\d$", r"^-(8\d|9\d|100)\.\d$"]
            expect(waiting.locator("td:nth-child(4)")).to_have_text(
                [re.compile(score) for score in scores], timeout=WAIT
            )
            expect(waiting.locator("td:nth-child(1)")).to_have_text(["1", "2", "3"])
            depths = page.locator("#bands tbody tr td:nth-child(2)")
            expect(depths).to_have_text(["0", "1", "1", "1", "0"], timeout=WAIT)
            serving = page.locator(f'#running tbody tr[data-key="{ids["holder"]}"]')
            expect(serving.locator('[data-role="state"]')).to_have_text("serving", timeout=WAIT)
            alpha = tab.model("alpha")
            expect(alpha.locator('[data-role="inflight"]')).to_have_text("1", timeout=WAIT)
            expect(alpha.locator('[data-role="waiting"]')).to_have_text("3", timeout=WAIT)
            expect(alpha.locator('[data-role="ttl"]')).to_have_text("none", timeout=WAIT)

            row = page.locator(f'#waiting tbody tr[data-key="{ids["normal"]}"]')
            row.get_by_role("button", name="Cancel").click()
            expect(row).to_have_count(0, timeout=WAIT)
            expect(waiting.locator("td:nth-child(2)")).to_have_text(
                [first_served_first[0], first_served_first[2]], timeout=WAIT
            )
            expect(depths).to_have_text(["0", "1", "0", "1", "0"], timeout=WAIT)
            assert tab.errors == []

        await in_browser(proxy.url, body)
        with trio.fail_after(10):
            await answered["normal"].wait()
        cancelled_error(answers["normal"], ids["normal"])
        assert {entry["id"] for entry in await inflight(client)} == {
            ids["holder"],
            ids["interactive"],
            ids["batch"],
        }
        nursery.cancel_scope.cancel()


PREEMPT = config(
    """
[models.alpha]
cmd = "${fake} --tokens-per-second 10"
[models.slow]
cmd = "${fake} --load-seconds 60"
[routing.scheduler]
use = "serial"
[routing.scheduler.settings.serial]
preempt = true
"""
)


async def paused(client: httpx.AsyncClient, request_id: int) -> dict[str, Any]:
    """Request ``request_id``'s /api/inflight entry once it is paused (polls, bounded by
    the caller's ``fail_after``)."""
    while True:
        for entry in await inflight(client):
            if entry["id"] == request_id and entry["paused"]:
                return entry
        await trio.sleep(0.02)


@needs_browser
async def test_a_preempted_request_shows_paused_in_the_queue_then_resumed(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    """Under serial with preempt, a streamed batch answer from alpha is preempted by an
    interactive request for slow, whose load takes a minute: the batch one waits, paused,
    for as long as the test looks. Cancelling the interactive one from the page resumes it.
    The picture goes to ``$LLAMASWAP_UI_SCREENSHOTS`` (``queue-paused.png``) when set."""
    target = screenshots(tmp_path)
    proxy = await proxy_factory(PREEMPT)
    answers: dict[str, httpx.Response] = {}
    answered = trio.Event()
    streamed: list[str] = []
    ids: dict[str, int] = {}
    async with proxy.client() as client, trio.open_nursery() as nursery:

        async def batch() -> None:
            body = chat("alpha", max_tokens=600, stream=True)  # a minute at 10 tokens/s
            headers = {PRIORITY: "batch"}
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as stream:
                async for piece in stream.aiter_text():
                    streamed.append(piece)

        async def interactive() -> None:
            body = chat("slow", max_tokens=1)
            headers = {PRIORITY: "interactive"}
            answers["interactive"] = await client.post(
                "/v1/chat/completions", json=body, headers=headers
            )
            answered.set()

        with trio.fail_after(30):
            known: set[int] = set()
            nursery.start_soon(batch)
            ids["batch"] = await new_request(client, known, "serving")
            nursery.start_soon(interactive)  # preempts it: slow must load
            ids["interactive"] = await new_request(client, known, "loading")
            entry = await paused(client, ids["batch"])
            assert (entry["state"], entry["preemptions"]) == ("queued", 1)

        def body(tab: Tab) -> None:
            tab.open()
            page = tab.page
            row = page.locator(f'#waiting tbody tr[data-key="{ids["batch"]}"]')
            expect(row.locator('[data-role="paused"]')).to_have_text("paused", timeout=WAIT)
            expect(row.locator('[data-role="paused"]')).to_be_visible()
            expect(row.locator('[data-role="preempted-text"]')).to_have_text(
                re.compile(r"^preempted 1 time · for (\d+ ms|\d+\.\d+ s)$"), timeout=WAIT
            )
            expect(row.locator('[data-role="preempted"]')).to_have_attribute(
                "title", re.compile(r"^preempted 1 time for more urgent work")
            )
            loading = page.locator(f'#running tbody tr[data-key="{ids["interactive"]}"]')
            expect(loading.locator('[data-role="state"]')).to_have_text("loading", timeout=WAIT)
            expect(loading.locator('[data-role="preempted"]')).to_be_hidden()
            page.locator("#queue-panel").screenshot(
                path=target / "queue-paused.png", animations="disabled"
            )
            # Its load cancelled, the interactive request leaves; the batch one goes on.
            loading.get_by_role("button", name="Cancel").click()
            expect(row).to_have_count(0, timeout=WAIT)
            resumed = page.locator(f'#running tbody tr[data-key="{ids["batch"]}"]')
            expect(resumed.locator('[data-role="state"]')).to_have_text("serving", timeout=WAIT)
            resumed_text = resumed.locator('[data-role="preempted-text"]')
            expect(resumed_text).to_have_text("preempted 1 time")
            expect(resumed.locator('[data-role="paused"]')).to_be_hidden()
            assert tab.errors == []

        await in_browser(proxy.url, body)
        with trio.fail_after(10):
            await answered.wait()
        cancelled_error(answers["interactive"], ids["interactive"])
        [entry] = await inflight(client)
        assert (entry["id"], entry["state"], entry["preemptions"]) == (ids["batch"], "serving", 1)
        assert not entry["paused"]
        assert streamed  # its stream went on
        nursery.cancel_scope.cancel()
    assert (await trio.Path(target / "queue-paused.png").stat()).st_size > 5_000


@needs_browser
async def test_the_activity_table_sorts_filters_moves_columns_and_updates_live(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            for priority in ("interactive", "batch", "normal"):
                headers = {PRIORITY: priority}
                answer = await client.post(
                    "/v1/chat/completions", json=chat("beta"), headers=headers
                )
                assert answer.status_code == 200
            missing = await client.post("/v1/chat/completions", json=chat("nope"))
            assert missing.status_code == 404

        async def one_more() -> None:
            headers = {PRIORITY: "7"}
            answer = await client.post("/v1/chat/completions", json=chat("beta"), headers=headers)
            assert answer.status_code == 200

        def body(tab: Tab) -> None:
            tab.open()
            page = tab.page
            rows = page.locator("#activity tbody tr")
            expect(rows).to_have_count(4, timeout=WAIT)
            ids = [int(text) for text in tab.column("id").all_inner_texts()]
            assert ids == sorted(ids, reverse=True)  # newest first
            expect(tab.column("status")).to_have_text(["404", "200", "200", "200"])
            # The request number the queue showed (#N); none for one never queued.
            expect(tab.column("request")).to_have_text(["—", "#2", "#1", "#0"])
            expect(tab.column("priority")).to_have_text(["0", "0", "-100", "+100"])
            expect(tab.column("band")).to_have_text(["normal", "normal", "batch", "interactive"])

            # Live: a new request shows at the top, without a reload.
            blocking(one_more)
            expect(rows).to_have_count(5, timeout=WAIT)
            expect(tab.column("priority").first).to_have_text("+7", timeout=WAIT)

            # Sorting: numbers high to low first, then low to high.
            page.get_by_role("button", name="Priority").click()
            heading = page.locator('#activity th[data-column="priority"]')
            expect(heading).to_have_attribute("aria-sort", "descending")
            expect(tab.column("priority")).to_have_text(["+100", "+7", "0", "0", "-100"])
            page.get_by_role("button", name="Priority").click()
            expect(heading).to_have_attribute("aria-sort", "ascending")
            expect(tab.column("priority")).to_have_text(["-100", "0", "0", "+7", "+100"])

            # Filters.
            filters = page.locator("#activity-filters")
            filters.get_by_label("Band").select_option("batch")
            expect(tab.column("band")).to_have_text(["batch"], timeout=WAIT)
            filters.get_by_label("Band").select_option("")
            filters.get_by_label("Status").select_option("4xx")
            expect(tab.column("status")).to_have_text(["404"], timeout=WAIT)
            filters.get_by_label("Status").select_option("")
            filters.get_by_label("Model").select_option("beta")
            expect(rows).to_have_count(4, timeout=WAIT)
            filters.get_by_label("Model").select_option("")

            # Columns move: drag a heading onto another, or Shift+arrow on it.
            assert tab.headings()[:2] == ["time", "id"]
            page.locator('#activity th[data-column="status"]').drag_to(
                page.locator('#activity th[data-column="time"]')
            )
            expect(page.locator("#activity thead th").first).to_have_attribute(
                "data-column", "status", timeout=WAIT
            )
            # sorted by priority, ascending; a tie is newest first
            expect(tab.column("status")).to_have_text(["200", "404", "200", "200", "200"])
            page.get_by_role("button", name="Status").press("Shift+ArrowRight")
            expect(page.locator("#activity thead th").nth(1)).to_have_attribute(
                "data-column", "status", timeout=WAIT
            )
            expect(page.get_by_role("button", name="Status")).to_be_focused()
            # Remembered: the same after a reload.
            page.reload()
            expect(page.locator("#activity thead th").nth(1)).to_have_attribute(
                "data-column", "status", timeout=WAIT
            )
            expect(heading).to_have_attribute("aria-sort", "ascending")
            assert tab.errors == []

        await in_browser(proxy.url, body)


@needs_browser
async def test_statistics_per_model_and_a_capture_opened_from_its_row(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    """alpha captures, beta does not. The statistics above the table count each model's
    requests, live; a captured row's button opens what it sent and was answered. The
    picture goes to ``$LLAMASWAP_UI_SCREENSHOTS`` (``capture.png``) when set."""
    target = Path(os.environ.get("LLAMASWAP_UI_SCREENSHOTS", tmp_path))
    proxy = await proxy_factory(
        config(
            """
[models.alpha]
cmd = "${fake} --tokens-per-second 200"
capture = true
[models.beta]
cmd = "${fake}"
"""
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            for tokens in (4, 8):
                answer = await client.post(
                    "/v1/chat/completions", json=chat("alpha", max_tokens=tokens)
                )
                assert answer.status_code == 200
            answer = await client.post("/v1/chat/completions", json=chat("beta"))
            assert answer.status_code == 200
            missing = await client.post("/v1/chat/completions", json=chat("nope"))
            assert missing.status_code == 404

        async def one_more() -> None:
            body = chat("alpha", max_tokens=6, messages=[{"role": "user", "content": "hi"}])
            answer = await client.post("/v1/chat/completions?trace=1", json=body)
            assert answer.status_code == 200

        def body(tab: Tab) -> None:
            tab.open()
            page = tab.page
            stats = page.locator("#stats-table tbody tr")
            expect(stats.locator("th")).to_have_text(["alpha", "beta"], timeout=WAIT)
            requests = stats.locator("td:nth-of-type(1)")
            expect(requests).to_have_text(["2", "1"])
            expect(page.locator("#stats-note")).to_have_text(
                "4 requests; percentiles of those served"
            )
            # Live: one more for alpha is counted without a reload.
            blocking(one_more)
            expect(requests).to_have_text(["3", "1"], timeout=WAIT)
            page.get_by_label("over the last").select_option("5m")
            expect(requests).to_have_text(["3", "1"], timeout=WAIT)
            # Only alpha's rows have a capture; the newest is the one just sent.
            rows = page.locator("#activity tbody tr")
            expect(rows).to_have_count(5, timeout=WAIT)
            expect(tab.column("capture")).to_have_text(["View", "—", "—", "View", "View"])
            expect(tab.column("ttft").first).not_to_have_text("—")
            newest = tab.column("id").first.inner_text()
            tab.column("capture").first.get_by_role("button").click()
            dialog = page.get_by_role("dialog", name=f"Capture of record {newest}")
            expect(dialog).to_be_visible(timeout=WAIT)
            request, response = dialog.locator(".capture-part").all()
            expect(request.locator(".capture-line")).to_have_text(
                "POST /v1/chat/completions?trace=1", timeout=WAIT
            )
            expect(request.locator(".capture-body")).to_contain_text('"content": "hi"')
            expect(response.locator(".capture-line")).to_have_text("200")
            expect(response.locator(".capture-body")).to_contain_text('"completion_tokens": 6')
            expect(response.locator(".capture-headers")).to_contain_text("x-llamaswap-upstream")
            dialog.screenshot(path=target / "capture.png", animations="disabled")
            dialog.get_by_role("button", name="Close").click()
            expect(dialog).to_be_hidden(timeout=WAIT)
            assert tab.errors == []

        await in_browser(proxy.url, body)


@needs_browser
async def test_logs_stream_live_with_a_model_picker_and_search(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:

        async def ask(model: str) -> None:
            answer = await client.post("/v1/chat/completions", json=chat(model))
            assert answer.status_code == 200

        def body(tab: Tab) -> None:
            tab.open()
            page = tab.page

            def shown_and_count() -> tuple[int, str]:
                """The lines shown and the count above them, read at one moment (a new
                line changes both in the same frame)."""
                shown, count = page.evaluate(
                    """() => [document.querySelectorAll("#log .line").length,
                              document.querySelector("#logs-count").textContent]"""
                )
                return int(shown), str(count)

            page.get_by_role("tab", name="Logs").click()
            log = page.locator("#log")
            page.get_by_label("Source").select_option("beta")
            blocking(ask, "beta")
            expect(log).to_contain_text("request POST /v1/chat/completions", timeout=WAIT)
            expect(log).not_to_contain_text("llamaswap.process")  # beta's output only

            page.get_by_label("Source").select_option("")  # everything
            expect(log).to_contain_text("model 'beta': ready", timeout=WAIT)
            expect(page.locator("#log .src").first).to_have_text("[beta] ", timeout=WAIT)

            page.get_by_label("Search").fill("post /v1/chat")
            lines = page.locator("#log .line")
            expect(lines).to_have_count(1, timeout=WAIT)
            expect(page.locator("#log mark")).to_have_text(["POST /v1/chat"])
            blocking(ask, "beta")  # a new matching line arrives while searching
            expect(lines).to_have_count(2, timeout=WAIT)

            page.get_by_label("Search").fill("")
            everything = shown_and_count()
            page.get_by_label("Source").select_option("-")  # llamaswap only
            expect(log).to_contain_text("model 'beta': ready", timeout=WAIT)
            expect(page.locator("#log .src")).to_have_count(0, timeout=WAIT)
            # The count is of llamaswap's lines (it was of every source's).
            shown, count = shown_and_count()
            assert count == f"{shown} lines"
            assert everything == (everything[0], f"{everything[0]} lines")
            assert everything[0] > shown
            page.get_by_label("Search").fill("model 'beta'")
            expect(page.locator("#logs-count")).to_have_text(
                re.compile(rf"^\d+ matching of {shown} lines$"), timeout=WAIT
            )
            assert tab.errors == []

        await in_browser(proxy.url, body)


@needs_browser
async def test_the_logs_tab_follows_the_log_again_after_llamaswap_restarts(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    """The shown Logs tab reads its stream again from the fresh snapshot after the page
    reconnects (it stayed at "[the log stream ended ...]" while the header said live), and
    shows the new history once."""
    text = config('[models.beta]\ncmd = "${fake}"')
    first = await proxy_factory(text)
    address = first.url.removeprefix("http://")

    async def restart() -> None:
        await first.terminate()
        again = await proxy_factory(text, args=("--listen", address))
        assert again.url == first.url
        async with again.client() as client:
            answer = await client.post("/v1/chat/completions", json=chat("beta"))
            assert answer.status_code == 200

    def body(tab: Tab) -> None:
        tab.open()
        page = tab.page
        log = page.locator("#log")
        page.get_by_role("tab", name="Logs").click()
        expect(log).to_contain_text("Running on http://", timeout=WAIT)
        blocking(restart)
        expect(log).to_contain_text("request POST /v1/chat/completions", timeout=WAIT)
        expect(page.locator("#conn")).to_have_attribute("data-state", "live")
        # The new process's history, once, and nothing of the old stream's end.
        expect(log.locator(".line", has_text="Running on http://")).to_have_count(1)
        expect(log).not_to_contain_text("the log stream")
        page.locator(".tabs-panel").screenshot(path=tmp_path / "logs-after-restart.png")
        assert all("ERR_CONNECTION_REFUSED" in error for error in tab.errors), tab.errors

    await in_browser(first.url, body)


@needs_browser
async def test_after_llamaswap_restarts_the_activity_table_is_the_new_process_s(
    proxy_factory: StartProxy,
) -> None:
    """Without a [store] a restarted llamaswap numbers its records from 1 again. The page
    kept its records by ID across the reconnection and drew each row once ("a record never
    changes"): the new records overwrote old ones unseen while the old rows stayed, and the
    Model filter showed the wrong rows. The snapshot now replaces what the page had."""
    text = config('[models.alpha]\ncmd = "${fake}"\n[models.beta]\ncmd = "${fake}"')
    first = await proxy_factory(text)
    address = first.url.removeprefix("http://")
    async with first.client() as client:
        with trio.fail_after(30):
            for _ in range(3):
                answer = await client.post("/v1/chat/completions", json=chat("beta"))
                assert answer.status_code == 200

    async def restart() -> list[dict[str, Any]]:
        await first.terminate()
        again = await proxy_factory(text, args=("--listen", address))
        async with again.client() as client:
            answer = await client.post("/v1/chat/completions", json=chat("alpha"))
            assert answer.status_code == 200
            records: list[dict[str, Any]] = (await client.get("/api/activity")).json()["activity"]
            return records

    def body(tab: Tab) -> None:
        tab.open()
        page = tab.page
        expect(tab.column("model")).to_have_text(["beta"] * 3, timeout=WAIT)
        records = blocking(restart)
        assert [record["model"] for record in records] == ["alpha"]
        # The table is GET /api/activity's, whenever the page reconnected.
        ids = [str(record["id"]) for record in records]
        expect(tab.column("id")).to_have_text(ids, timeout=WAIT)
        expect(tab.column("model")).to_have_text(["alpha"])
        expect(page.locator("#activity-count")).to_have_text("1 record")
        model = page.locator("#activity-filters").get_by_label("Model")
        model.select_option("beta")
        expect(page.locator("#activity-empty")).to_be_visible(timeout=WAIT)
        expect(page.locator("#activity tbody tr")).to_have_count(0)
        model.select_option("alpha")
        expect(tab.column("id")).to_have_text(ids, timeout=WAIT)
        assert all("ERR_CONNECTION_REFUSED" in error for error in tab.errors), tab.errors

    await in_browser(first.url, body)


def without_times(route: Route) -> None:
    """``/v1/models`` with every model's ``ttl``, ``ttl_left`` and ``loaded_since`` null."""
    answer = route.fetch()
    listed = answer.json()
    for entry in listed["data"]:
        status = entry.get("meta", {}).get("llamaswap")
        if status is not None:
            status.update(ttl=None, ttl_left=None, loaded_since=None)
    route.fulfill(response=answer, json=listed)


@needs_browser
async def test_a_request_waiting_for_a_ready_model_pauses_its_ttl_until_it_leaves(
    proxy_factory: StartProxy,
) -> None:
    """Under serial, beta (ttl 300 s) is ready and a request for it waits for the slot
    alpha holds: its TTL does not run, on the server or on the page, until that request
    is cancelled (the server unloaded beta meanwhile, and the page counted down)."""
    proxy = await proxy_factory(
        config(
            '[models.alpha]\ncmd = "${fake} --tokens-per-second 10"\n'
            '[models.beta]\ncmd = "${fake}"\nttl = 300\n'
            '[routing.router.settings.groups.both]\nmembers = ["alpha", "beta"]\nswap = false\n'
            '[routing.scheduler]\nuse = "serial"'
        )
    )

    async def ttl_left(client: httpx.AsyncClient) -> object:
        listed = (await client.get("/v1/models/beta")).json()
        return listed["meta"]["llamaswap"]["ttl_left"]

    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(30):
            assert (
                await client.post("/v1/chat/completions", json=chat("beta"))
            ).status_code == 200
            assert isinstance(await ttl_left(client), float)
            known: set[int] = set()
            send = partial(client.post, "/v1/chat/completions")
            nursery.start_soon(partial(send, json=chat("alpha", max_tokens=600)))  # a minute
            await new_request(client, known, "serving")
            nursery.start_soon(partial(send, json=chat("beta")))
            waiting = await new_request(client, known, "queued")
            assert await ttl_left(client) is None

        def body(tab: Tab) -> None:
            # The page shows what the events say: with /v1/models saying nothing of the
            # TTL or of since when a model is loaded, the card says it all the same.
            tab.page.route(re.compile(r"/v1/models$"), without_times)
            tab.open()
            beta = tab.model("beta")
            ttl = beta.locator('[data-role="ttl"]')
            expect(ttl).to_have_text("paused", timeout=WAIT)
            expect(ttl).to_have_attribute("title", re.compile(r"the 5m 00s countdown"))
            expect(beta.locator('[data-role="since"]')).to_have_text(re.compile(r" ago$"))
            expect(beta.locator('[data-role="waiting"]')).to_have_text("1")
            row = tab.page.locator(f'#waiting tbody tr[data-key="{waiting}"]')
            row.get_by_role("button", name="Cancel").click()
            expect(ttl).to_have_text(re.compile(r"^[45]m \d\ds$"), timeout=WAIT)
            expect(beta.locator('[data-role="waiting"]')).to_have_text("0")
            # Between events the countdown runs on, on the page's own clock.
            shown = ttl.inner_text()
            expect(ttl).not_to_have_text(shown, timeout=WAIT)

        await in_browser(proxy.url, body)
        with trio.fail_after(10):
            assert isinstance(await ttl_left(client), float)
        nursery.cancel_scope.cancel()


@needs_browser
async def test_while_llamaswap_is_down_the_page_is_stale_and_its_buttons_off(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    """Killed, llamaswap left a page that looked live ("In flight 1", a queued request's
    wait counting up) with every button on, each click a "Failed to fetch" toast. Now
    the panels are dimmed with a note, their clock stops, the buttons are off, and the
    new process's snapshot puts it all right."""
    text = config(
        '[models.alpha]\ncmd = "${fake} --tokens-per-second 10"\n'
        '[routing.scheduler]\nuse = "serial"'
    )
    first = await proxy_factory(text)
    address = first.url.removeprefix("http://")
    ids: dict[str, int] = {}
    async with first.client() as client, trio.open_nursery() as nursery:

        async def send(max_tokens: int) -> None:
            with contextlib.suppress(httpx.HTTPError):  # llamaswap dies under it
                await client.post(
                    "/v1/chat/completions", json=chat("alpha", max_tokens=max_tokens)
                )

        with trio.fail_after(30):
            known: set[int] = set()
            nursery.start_soon(send, 600)  # a minute at 10 tokens/s
            ids["holder"] = await new_request(client, known, "serving")
            nursery.start_soon(send, 1)
            ids["queued"] = await new_request(client, known, "queued")

        async def kill() -> None:
            first.process.kill()  # its models die with it (the lifeline)
            await first.process.wait()

        async def start_again() -> None:
            await proxy_factory(text, args=("--listen", address))

        def body(tab: Tab) -> None:
            tab.open()
            page = tab.page
            main, gate = page.locator("main"), page.locator("#gate")
            alpha = tab.model("alpha")
            unload = alpha.get_by_role("button", name="Unload alpha")
            queued = page.locator(f'#waiting tbody tr[data-key="{ids["queued"]}"]')
            cancel = queued.get_by_role("button", name="Cancel")
            reload = page.get_by_role("button", name="Reload config")
            play = page.get_by_role("button", name="Send", exact=True, include_hidden=True)
            expect(alpha.locator('[data-role="inflight"]')).to_have_text("1", timeout=WAIT)
            for button in (unload, cancel, reload, play):
                expect(button).to_be_enabled(timeout=WAIT)
            expect(gate).to_be_hidden()
            reload.click()
            expect(page.locator("#reload-summary")).to_contain_text(
                "nothing changed", timeout=WAIT
            )

            blocking(kill)
            expect(page.locator("#conn")).to_have_attribute("data-state", "retrying", timeout=WAIT)
            expect(main).to_have_class(re.compile(r"\bstale\b"))
            expect(gate).to_contain_text("Not live: this is the last state llamaswap sent")
            expect(page.locator(".live-grid")).to_have_css("opacity", "0.55")
            for button in (unload, cancel, reload, play):
                expect(button).to_be_disabled()
            # Its clock is stopped: the wait shown stays while the header counts down.
            waited = queued.locator('[data-role="waited"]')
            countdown = page.locator("#conn-text")
            before, said = waited.inner_text(), countdown.inner_text()
            expect(countdown).not_to_have_text(said, timeout=WAIT)
            expect(waited).to_have_text(before)
            page.screenshot(path=tmp_path / "stale.png")

            blocking(start_again)
            expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT)
            expect(main).not_to_have_class(re.compile(r"\bstale\b"))
            expect(gate).to_be_hidden()
            expect(page.locator("#waiting tbody tr")).to_have_count(0)
            expect(state_of(alpha)).to_have_text("stopped")
            # The last reload's result was the old process's: gone with it.
            expect(page.locator("#reload-summary")).to_be_hidden()
            for button in (alpha.get_by_role("button", name="Load alpha", exact=True), reload):
                expect(button).to_be_enabled()
            # Only loads the kill cut or refused, at the network level: which ones
            # depends on where each was when the process died (a stream, a fetch of
            # known length, a socket being opened), so no list of them holds. Not one
            # uncaught error, and no HTTP error status from either process.
            network = re.compile(r"^Failed to load resource: net::ERR_[A-Z_]+$")
            assert all(network.match(error) for error in tab.errors), tab.errors

        await in_browser(first.url, body)
        nursery.cancel_scope.cancel()


@needs_browser
async def test_the_model_pickers_offer_the_models_the_cards_show(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    """The Logs Source and the Activity model filter list the models shown as cards (and
    Activity any model its records name): not a stopped unlisted model, and not one a
    reload removed, which the page still hears stop after its fresh snapshot."""
    models = """
[models.beta]
cmd = "${fake}"
[models.hidden]
cmd = "${fake}"
unlisted = true
"""
    gamma = """
[models.gamma]
cmd = "${fake} --ignore-sigterm"
unloadTimeout = 2
"""
    proxy = await proxy_factory(config(models + gamma))
    original = await trio.Path(proxy.config).read_text()
    async with proxy.client() as client:
        assert (await client.post("/api/models/load/gamma")).status_code == 200

    def body(tab: Tab) -> None:
        tab.open()
        page = tab.page
        expect(state_of(tab.model("gamma"))).to_have_text("ready", timeout=WAIT)
        source = page.get_by_label("Source")
        sources = source.locator("option")
        activity_models = page.locator("#activity-filters").get_by_label("Model").locator("option")
        expect(sources).to_have_text(["everything", "llamaswap only", "beta", "gamma"])
        expect(activity_models).to_have_text(["any", "beta", "gamma"])  # gamma: its load

        page.get_by_role("tab", name="Logs").click()
        source.select_option("gamma")
        expect(page.locator("#log")).to_contain_text("listening on", timeout=WAIT)
        proxy.config.write_text(original.replace(gamma, ""))
        page.get_by_role("button", name="Reload config").click()
        expect(page.locator("#reload-summary")).to_contain_text("1 removed", timeout=WAIT)
        # It ignores SIGTERM: stopping for its unloadTimeout, then killed, and gone.
        expect(tab.model("gamma")).to_have_count(0, timeout=WAIT)
        expect(sources).to_have_text(["everything", "llamaswap only", "beta"], timeout=WAIT)
        expect(source).to_have_value("")  # its model went: everything, read afresh
        expect(page.locator("#log")).to_contain_text("model 'gamma': stopped", timeout=WAIT)
        expect(page.locator("#log")).not_to_contain_text("the log stream")
        page.locator(".tabs-panel").screenshot(path=tmp_path / "removed.png")
        page.get_by_role("tab", name="Activity").click()
        expect(activity_models).to_have_text(["any", "beta", "gamma"])  # its record stays
        assert tab.errors == []

    await in_browser(proxy.url, body)


@needs_browser
async def test_the_playground_follows_its_request_through_the_load(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)

    def body(tab: Tab) -> None:
        tab.open()
        page = tab.page
        page.get_by_role("tab", name="Playground").click()
        page.locator("#playground-panel").get_by_label("Model").select_option(
            "alpha"
        )  # --load-seconds 1
        page.get_by_label("Priority").select_option("interactive")
        page.get_by_label("Max tokens").fill("5")
        page.get_by_role("button", name="Send", exact=True).click()
        card = page.locator("#runs li").first
        expect(card.locator('[data-step="done"]')).to_have_class("done", timeout=WAIT)
        for step in ("sent", "queued", "loading", "streaming"):
            expect(card.locator(f'[data-step="{step}"]')).to_have_class("done")
        expect(card.locator(".run-head strong")).to_have_text(re.compile(r"^#\d+$"))
        expect(card.locator(".run-out")).to_have_text(re.compile(r"^\S+( \S+){4}$"))
        expect(card.locator(".run-note")).to_contain_text("5 chunks")
        expect(state_of(tab.model("alpha"))).to_have_text("ready", timeout=WAIT)
        assert tab.errors == []

    await in_browser(proxy.url, body)
    async with proxy.client() as client:
        (record,) = (await client.get("/api/activity", params={"model": "alpha"})).json()[
            "activity"
        ]
    assert (record["priority"], record["band"], record["status"]) == (100, "interactive", 200)


PROFILES = config(
    """
[models.alpha]
cmd = "${fake}"
[models.beta]
cmd = "${fake}"
[profiles.beta-day]
description = "everything on beta"
pins = {alpha = "beta", off = ""}
[profiles.quiet]
pins = {beta = ""}
"""
)


@needs_browser
async def test_the_header_shows_the_active_profile_and_switches_it(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    proxy = await proxy_factory(PROFILES)

    async def active() -> object:
        async with proxy.client() as client:
            return (await client.get("/api/profiles")).json()["active"]

    async def switch(profile: str | None) -> None:
        async with proxy.client() as client:
            answer = await client.put("/api/profiles/active", json={"profile": profile})
            assert answer.status_code == 200

    def body(tab: Tab) -> None:
        tab.open()
        page = tab.page
        select = page.get_by_label("Profile")
        expect(select).to_have_value("", timeout=WAIT)  # none
        options = select.locator("option")
        expect(options).to_have_text(["none", "beta-day", "quiet"])
        select.select_option("beta-day")
        expect(page.locator("#profile-pins")).to_have_text("alpha → beta, off → off")
        assert blocking(active) == "beta-day"
        page.locator("header").screenshot(
            path=screenshots(tmp_path) / "profile.png", animations="disabled"
        )
        blocking(switch, "quiet")  # another client switches it: the page follows
        expect(select).to_have_value("quiet", timeout=WAIT)
        expect(page.locator("#profile-pins")).to_have_text("beta → off")
        select.select_option("")
        expect(page.locator("#profile-pins")).to_have_text("")
        assert blocking(active) is None
        assert tab.errors == []

    await in_browser(proxy.url, body)


@needs_browser
async def test_the_reload_button_and_the_result_of_the_last_reload(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.beta]\ncmd = "${fake}"'))
    original = await trio.Path(proxy.config).read_text()

    def body(tab: Tab) -> None:
        tab.open()
        page = tab.page
        button = page.get_by_role("button", name="Reload config")
        summary = page.locator("#reload-summary")
        button.click()
        expect(summary).to_contain_text("(api): nothing changed", timeout=WAIT)

        proxy.config.write_text(original + '\n[models.gamma]\ncmd = "${fake}"\n')
        button.click()
        expect(summary).to_contain_text("(api): 1 added", timeout=WAIT)
        expect(state_of(tab.model("gamma"))).to_have_text("stopped", timeout=WAIT)

        proxy.config.write_text(original + "\n[models.delta]\ncmd = 'x'\nttl = 'soon'\n")
        button.click()
        expect(summary).to_contain_text("Reload refused", timeout=WAIT)
        summary.click()
        details = page.locator("#reload-details")
        expect(details).to_contain_text("models.delta.ttl", timeout=WAIT)
        expect(summary).to_have_attribute("aria-expanded", "true")
        # In the page's flow, under the header: it covers no panel (it was an overlay).
        opened, models = details.bounding_box(), page.locator("#models-panel").bounding_box()
        assert opened is not None
        assert models is not None
        assert opened["y"] + opened["height"] <= models["y"]
        summary.press("Enter")  # and it closes again, from the keyboard too
        expect(details).to_be_hidden()
        expect(state_of(tab.model("gamma"))).to_have_text("stopped")  # the config stays
        assert all("status of 400" in error for error in tab.errors), tab.errors

    await in_browser(proxy.url, body)


@needs_browser
async def test_with_api_keys_the_page_is_refused_until_a_key_is_given(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.beta]\ncmd = "${fake}"', apiKeys=["sk-ui-1"]))

    def body(tab: Tab) -> Any:
        page = tab.page
        urls: list[str] = []
        authorizations: list[str | None] = []

        def seen(request: Any) -> None:
            urls.append(request.url)
            if request.url.endswith("/api/events"):
                authorizations.append(request.headers.get("authorization"))

        page.on("request", seen)
        page.goto(f"{tab.url}/ui/")
        dialog = page.get_by_role("dialog", name="API key needed")
        expect(dialog).to_be_visible(timeout=WAIT)
        expect(page.locator("#models article")).to_have_count(0)
        expect(page.locator("#conn")).not_to_have_attribute("data-state", "live")

        # The prompt dismissed: the page says a key is needed, and shows no empty panels
        # (it showed "No models yet.", "0 records", "No requests yet.").
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden(timeout=WAIT)
        expect(page.locator("#gate")).to_contain_text("An API key is needed", timeout=WAIT)
        for empty in ("No models yet.", "No requests yet.", "Nothing waits."):
            expect(page.get_by_text(empty)).to_be_hidden()
        expect(page.locator("#activity-count")).to_be_hidden()
        expect(page.locator("#bands")).to_be_hidden()
        page.get_by_role("button", name="API key").click()
        expect(dialog).to_be_visible(timeout=WAIT)

        page.get_by_label("Key", exact=True).fill("sk-wrong")
        page.get_by_role("button", name="Use key").click()
        expect(page.locator("#key-error")).to_have_text("That key was refused.", timeout=WAIT)
        expect(dialog).to_be_visible()
        expect(page.locator("#models article")).to_have_count(0)

        page.get_by_label("Key", exact=True).fill("sk-ui-1")
        page.get_by_role("button", name="Use key").click()
        expect(dialog).to_be_hidden(timeout=WAIT)
        expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT)
        expect(state_of(tab.model("beta"))).to_have_text("stopped", timeout=WAIT)
        expect(page.locator("#gate")).to_be_hidden()
        expect(page.get_by_text("No requests yet.")).to_be_visible()
        assert authorizations[-1] == "Bearer sk-ui-1"
        assert None in authorizations  # the first try, before the key was asked for

        page.reload()  # asked once: the tab remembers it
        expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT)
        expect(dialog).to_be_hidden()
        assert not [url for url in urls if "sk-" in url]
        return page.context.storage_state()

    storage = await in_browser(proxy.url, body)
    # Not asked to remember it: a new browser session asks again.
    assert "sk-ui-1" not in json.dumps(storage)


@needs_browser
async def test_a_key_no_header_can_carry_is_refused_and_asked_for_again(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    """A zero-width space or a curly quote pasted with the key: fetch() cannot send it, and
    the page used to show "disconnected, retrying" for ever (after a reload too, when the
    key was remembered, with the API key button hidden)."""
    proxy = await proxy_factory(config('[models.beta]\ncmd = "${fake}"', apiKeys=["sk-ui-1"]))

    def body(tab: Tab) -> None:
        page = tab.page
        page.goto(f"{tab.url}/ui/")
        dialog = page.get_by_role("dialog", name="API key needed")
        error = page.locator("#key-error")
        expect(dialog).to_be_visible(timeout=WAIT)
        for bad, said in (("sk-ui-1\u200b", "U+200B"), ("\u2018sk-ui-1\u2019", "U+2018")):
            page.get_by_label("Key", exact=True).fill(bad)
            page.get_by_role("button", name="Use key").click()
            expect(error).to_contain_text(f"That key holds {said}", timeout=WAIT)
            expect(error).to_contain_text("printable ASCII without spaces")
            expect(dialog).to_be_visible()
            expect(page.locator("#conn")).to_have_attribute("data-state", "key")
        page.get_by_label("Key", exact=True).fill("sk-ui-1")
        page.get_by_role("button", name="Use key").click()
        expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT)
        page.screenshot(path=tmp_path / "key-live.png")

        # One saved by an older page (or by hand): the prompt says why, and the key works.
        page.evaluate(
            """() => {
                sessionStorage.clear();
                localStorage.setItem("llamaswap.apiKey", "sk-ui-1\u200b");
            }"""
        )
        page.reload()
        expect(dialog).to_be_visible(timeout=WAIT)
        expect(error).to_contain_text("The saved key could not be used", timeout=WAIT)
        expect(error).to_contain_text("U+200B")
        expect(page.get_by_role("button", name="API key")).to_be_visible()
        page.screenshot(path=tmp_path / "key-saved-unusable.png")
        assert page.evaluate('localStorage.getItem("llamaswap.apiKey")') is None
        page.get_by_label("Key", exact=True).fill("sk-ui-1")
        page.get_by_role("button", name="Use key").click()
        expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT)
        expect(state_of(tab.model("beta"))).to_have_text("stopped", timeout=WAIT)

    await in_browser(proxy.url, body)


GIB = 2**30


def fake_gpu(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU probe's test double for the proxies started from here on: one 24 GiB
    device in ``folder``, where fake servers started with ``--memory`` "allocate"."""
    folder.mkdir()
    (folder / "devices.json").write_text(
        json.dumps({"gpu0": {"total": 24 * GIB, "name": "Fake GPU"}})
    )
    monkeypatch.setenv("LLAMASWAP_FAKE_GPU", str(folder))


def with_eta(seconds: dict[int, float | None]) -> Callable[[Route], None]:
    """``/api/inflight`` with ``eta_seconds`` set as ``seconds`` says, by request ID."""

    def fulfil(route: Route) -> None:
        answer = route.fetch()
        listed = answer.json()
        for entry in listed["inflight"]:
            if entry["id"] in seconds:
                entry["eta_seconds"] = seconds[entry["id"]]
        route.fulfill(response=answer, json=listed)

    return fulfil


@needs_browser
async def test_the_memory_bar_shows_what_each_model_holds_and_what_a_waiting_load_needs(
    proxy_factory: StartProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a 24 GiB fake GPU, chat (14 GiB) serves a long answer while a request for
    coder (12 GiB) waits: the two do not fit together. The bar shows chat's 14 GiB, in
    its card's colour, and coder's need past the budget; the queue shows the waiting
    request's estimate as a bar. Once chat's answer is cancelled, coder takes its place."""
    fake_gpu(tmp_path / "gpu", monkeypatch)
    proxy = await proxy_factory(
        config(
            """
[devices.gpu0]
memory = "24GiB"
[models.chat]
cmd = "${fake} --tokens-per-second 10 --memory 14GiB"
memory = "14GiB"
[models.coder]
cmd = "${fake} --memory 12GiB"
memory = "12GiB"
"""
        )
    )
    async with proxy.client() as client, trio.open_nursery() as nursery:
        send = partial(client.post, "/v1/chat/completions")
        known: set[int] = set()
        etas: dict[int, float | None] = {}

        async def chat_busy_and_coder_waiting() -> int:
            with trio.fail_after(30):
                nursery.start_soon(partial(send, json=chat("chat", max_tokens=600)))  # a minute
                await new_request(client, known, "serving")
                nursery.start_soon(partial(send, json=chat("coder")))
                return await new_request(client, known, "queued")

        def body(tab: Tab) -> None:
            page = tab.page
            page.route(re.compile(r"/api/inflight$"), with_eta(etas))
            tab.open()
            device = page.locator("#devices .device")
            expect(device).to_have_count(1, timeout=WAIT)
            expect(device.locator(".device-label")).to_have_text("Fake GPU")
            # Nothing runs: the whole budget is free, nothing is drawn.
            expect(device.locator(".mem-legend")).to_have_text(
                "23.5 GiB free of a 23.5 GiB budget (headroom 512 MiB)", timeout=WAIT
            )
            expect(device.locator(".mem-part")).to_have_count(0)
            card = tab.model("chat")
            expect(card.locator('[data-role="memory"]')).to_have_text("needs 14 GiB (declared)")

            waiting = blocking(chat_busy_and_coder_waiting)
            held = device.locator(".mem-part.held")
            expect(held).to_have_text(["chat 14 GiB"], timeout=WAIT)
            need = device.locator(".mem-part.need")
            expect(need).to_have_text("coder needs 12 GiB", timeout=WAIT)
            expect(need).to_have_class(re.compile(r"\bover\b"))  # past the budget
            expect(device.locator(".mem-legend li")).to_have_text(
                [
                    "chat 14 GiB",
                    "coder needs 12 GiB",
                    re.compile(r"^9(\.\d)? GiB free of a 23\.5 GiB"),
                ]
            )
            expect(device.locator(".device-sum")).to_have_text("14 GiB used of 24 GiB")
            expect(card.locator('[data-role="held"]')).to_have_text(" · holds 14 GiB")
            # The bar's colours are the cards' swatches; the need is hatched in coder's.
            colour = "el => getComputedStyle(el).backgroundColor"
            swatch = card.locator('[data-role="swatch"]').evaluate(colour)
            assert held.evaluate(colour) == swatch
            variable = "el => getComputedStyle(el).getPropertyValue('--colour')"
            coder = tab.model("coder").locator('[data-role="swatch"]')
            assert need.evaluate(variable) == coder.evaluate(variable) != held.evaluate(variable)
            page.screenshot(path=tmp_path / "memory.png", full_page=True)

            # The estimate, as /api/inflight's eta_seconds says it (set here: the bar is
            # the page's; the figure is llamaswap's).
            eta = page.locator(f'#waiting tbody tr[data-key="{waiting}"] [data-role="eta"]')
            expect(eta).to_be_hidden()
            etas[waiting] = 30.0
            expect(eta).to_be_visible(timeout=WAIT)
            expect(eta).to_have_text(re.compile(r"^about (30|29|28)\s+s$"))
            fill: float = eta.locator(".eta-fill").evaluate(
                "el => el.getBoundingClientRect().width / el.parentElement.clientWidth"
            )
            assert 0 < fill < 0.5, fill
            page.locator("#queue-panel").screenshot(path=tmp_path / "eta.png")
            etas[waiting] = None  # no estimate: nothing shown
            expect(eta).to_be_hidden(timeout=WAIT)

            serving = page.locator("#running tbody tr").first
            serving.get_by_role("button", name="Cancel").click()
            expect(held).to_have_text(["coder 12 GiB"], timeout=WAIT)
            expect(need).to_have_count(0)
            expect(state_of(tab.model("chat"))).to_have_text("stopped", timeout=WAIT)
            expect(card.locator('[data-role="held"]')).to_have_text("")
            page.locator("#models-panel").screenshot(path=tmp_path / "memory-after.png")
            assert tab.errors == []

        await in_browser(proxy.url, body)
        nursery.cancel_scope.cancel()


@needs_browser
async def test_without_a_gpu_probe_the_memory_bar_says_why(
    proxy_factory: StartProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No probe and no device: one muted line with llamaswap's reason, no bars, and no
    memory on the cards. No probe but a declared device: the bar shows the budget and a
    running model counted for its declared need, with the reason under it."""
    monkeypatch.delenv("LLAMASWAP_FAKE_GPU", raising=False)
    bare = await proxy_factory(config('[models.beta]\ncmd = "${fake}"'))
    declared = await proxy_factory(
        config('[devices.gpu0]\nmemory = "24GiB"\n[models.beta]\ncmd = "${fake}"\nmemory = "8GiB"')
    )
    async with bare.client() as client:
        resources = (await client.get("/api/resources")).json()
    if resources["probe"] is not None:
        pytest.skip(f"this machine has a GPU probe ({resources['probe']})")
    absent = resources["absent"]
    assert absent

    def without_devices(tab: Tab) -> None:
        page = tab.page
        tab.open()
        note = page.locator("#memory-note")
        expect(note).to_have_text(f"No GPU figures: {absent}.", timeout=WAIT)
        expect(note).to_have_class("hint")
        expect(page.locator("#devices .device")).to_have_count(0)
        expect(page.locator("#memory-h")).to_be_hidden()  # one line, no heading
        expect(tab.model("beta").locator('[data-role="memory-facts"]')).to_be_hidden()
        expect(tab.model("beta").locator('[data-role="swatch"]')).to_be_hidden()
        page.locator("#models-panel").screenshot(path=tmp_path / "memory-absent.png")
        assert tab.errors == []

    await in_browser(bare.url, without_devices)
    async with declared.client() as client:
        with trio.fail_after(30):
            assert (
                await client.post("/v1/chat/completions", json=chat("beta"))
            ).status_code == 200

    def with_a_declared_device(tab: Tab) -> None:
        page = tab.page
        tab.open()
        device = page.locator("#devices .device")
        expect(device.locator(".mem-part.counted")).to_have_text(
            "beta 8 GiB declared", timeout=WAIT
        )
        expect(device.locator(".mem-part.held")).to_have_count(0)  # nothing measured
        expect(device.locator(".mem-legend li").last).to_have_text(
            "15.5 GiB free of a 23.5 GiB budget (headroom 512 MiB)"
        )
        expect(page.locator("#memory-note")).to_have_text(f"No GPU figures: {absent}.")
        expect(tab.model("beta").locator('[data-role="memory"]')).to_have_text(
            "needs 8 GiB (declared)"
        )
        page.locator("#models-panel").screenshot(path=tmp_path / "memory-declared.png")
        assert tab.errors == []

    await in_browser(declared.url, with_a_declared_device)


@needs_browser
async def test_screenshots_in_light_and_dark_at_1280_and_390_pixels(
    proxy_factory: StartProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under serial on a 24 GiB fake GPU: chat (14 GiB) serves a long answer with embed
    (2 GiB) loaded beside it, four requests for chat and one for coder (12 GiB, which
    does not fit beside chat) wait."""
    target = screenshots(tmp_path)
    await trio.Path(target).mkdir(parents=True, exist_ok=True)
    fake_gpu(tmp_path / "gpu", monkeypatch)
    proxy = await proxy_factory(
        config(
            """
[devices.gpu0]
memory = "24GiB"
[models.chat]
cmd = "${fake} --load-seconds 1 --tokens-per-second 10 --memory 14GiB"
name = "Chat (fake)"
ttl = 300
memory = "14GiB"
capture = true
[models.coder]
cmd = "${fake} --load-seconds 2 --tokens-per-second 20 --memory 12GiB"
name = "Coder (fake)"
memory = "12GiB"
[models.embed]
cmd = "${fake} --memory 2GiB"
memory = "2GiB"
[routing.scheduler]
use = "serial"
"""
        )
    )
    async with proxy.client() as client, trio.open_nursery() as nursery:

        async def send(model: str, priority: str, max_tokens: int) -> None:
            body = chat(model, max_tokens=max_tokens)
            await client.post("/v1/chat/completions", json=body, headers={PRIORITY: priority})

        async def busy() -> None:
            """Some history, then chat serving a long answer with four more waiting."""
            with trio.fail_after(30):
                await send("coder", "batch", 8)
                await send("nope", "normal", 1)
                await send("chat", "interactive", 12)  # coder gives way: both do not fit
                embedding = {"model": "embed", "input": "hello"}
                assert (await client.post("/v1/embeddings", json=embedding)).status_code == 200
                known = {entry["id"] for entry in await inflight(client)}
                nursery.start_soon(send, "chat", "normal", 600)
                await new_request(client, known, "serving")
                for model, priority in (("chat", "batch"), ("coder", "batch")):
                    nursery.start_soon(send, model, priority, 4)
                    await new_request(client, known, "queued")
                for priority in ("normal", "interactive"):
                    nursery.start_soon(send, "chat", priority, 4)
                    await new_request(client, known, "queued")

        def light(tab: Tab) -> None:
            tab.open()
            page = tab.page
            page.get_by_role("tab", name="Playground").click()
            page.locator("#playground-panel").get_by_label("Model").select_option("chat")
            page.get_by_label("Max tokens").fill("24")
            page.get_by_role("button", name="Send", exact=True).click()
            card = page.locator("#runs li").first
            expect(card.locator('[data-step="done"]')).to_have_class("done", timeout=WAIT)
            blocking(busy)
            page.get_by_label("Priority").select_option("interactive")
            page.get_by_role("button", name="Send", exact=True).click()
            expect(page.locator("#waiting tbody tr")).to_have_count(5, timeout=WAIT)
            expect(page.locator("#runs li").first.locator('[data-step="queued"]')).to_have_class(
                "now", timeout=WAIT
            )
            memory = page.locator("#memory")
            expect(memory.locator(".mem-part.held")).to_have_text(
                ["chat 14 GiB", "embed 2 GiB"], timeout=WAIT
            )
            expect(memory.locator(".mem-part.need")).to_have_text("coder needs 12 GiB")
            # Each waiting request's estimate (llamaswap's, from the history above).
            expect(page.locator('#waiting [data-role="eta"]:visible')).to_have_count(
                5, timeout=WAIT
            )
            # The card's counts come with the model's coalesced event (at most 100 ms on).
            waiting = tab.model("chat").locator('[data-role="waiting"]')
            expect(waiting).to_have_text("4", timeout=WAIT)
            page.screenshot(path=target / "dashboard.png", full_page=True, animations="disabled")
            page.locator("#models-panel").screenshot(
                path=target / "models.png", animations="disabled"
            )
            memory.screenshot(path=target / "memory.png", animations="disabled")
            page.locator("#queue-panel").screenshot(
                path=target / "queue.png", animations="disabled"
            )
            page.locator(".tabs-panel").screenshot(
                path=target / "playground.png", animations="disabled"
            )
            page.get_by_role("tab", name="Activity").click()
            expect(page.locator("#activity tbody tr")).to_have_count(5, timeout=WAIT)
            page.locator(".tabs-panel").screenshot(
                path=target / "activity.png", animations="disabled"
            )
            page.get_by_role("tab", name="Logs").click()
            expect(page.locator("#log")).to_contain_text("model 'chat': ready", timeout=WAIT)
            page.get_by_label("Search").fill("chat")
            expect(page.locator("#log mark").first).to_have_text("chat", timeout=WAIT)
            page.locator(".tabs-panel").screenshot(path=target / "logs.png", animations="disabled")
            assert tab.errors == []

        def dark(tab: Tab, width: int) -> tuple[str, bool]:
            tab.open()
            page = tab.page
            # The playground's request left with the first browser: four wait.
            expect(page.locator("#waiting tbody tr")).to_have_count(4, timeout=WAIT)
            # What is read besides the events: the cards' names (listed), the memory.
            expect(page.locator("#models article")).to_have_count(3, timeout=WAIT)
            expect(page.locator("#memory .mem-part.need")).to_have_text(
                "coder needs 12 GiB", timeout=WAIT
            )
            expect(page.locator('#waiting [data-role="eta"]:visible')).to_have_count(
                4, timeout=WAIT
            )
            page.screenshot(
                path=target / f"dashboard-dark-{width}.png",
                full_page=width < 600,
                animations="disabled",
            )
            background: str = page.evaluate("getComputedStyle(document.body).backgroundColor")
            fits: bool = page.evaluate(
                "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
            )
            return background, fits

        await in_browser(proxy.url, light)
        wide = await in_browser(proxy.url, partial(dark, width=1280), color_scheme="dark")
        assert wide == ("rgb(15, 18, 23)", True)
        phone = await in_browser(
            proxy.url, partial(dark, width=390), width=390, color_scheme="dark"
        )
        assert phone == ("rgb(15, 18, 23)", True)  # no sideways scrolling at 390 px
        nursery.cancel_scope.cancel()
    for name in ("dashboard", "models", "memory", "queue", "activity", "logs", "playground"):
        assert (await trio.Path(target / f"{name}.png").stat()).st_size > 5_000
