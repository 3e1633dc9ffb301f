"""A user's first contact, ``pipx install llamaswap && llamaswap quickstart``: the wheel
built from this checkout, installed into a new virtual environment, runs with no checkout
in sight (no ``PYTHONPATH``, a temporary working directory, ``PATH`` without llamaswap's
``python``).

One module-scoped installation (about 10 s: the build, then pip from its cache) serves every
test here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
import trio

import llamaswap
from tests.e2e.harness import LISTENING, MARKER_VARIABLE, REPO, collected, stop
from tests.e2e.test_proxy import chat
from tests.unit.test_import_config import FIXTURE

pytestmark = pytest.mark.slow

#: What the wheel is built from: pyproject.toml's [tool.setuptools] takes the rest from here.
SOURCES = ("pyproject.toml", "README.md", "llamaswap")


class Installed:
    """A virtual environment with llamaswap installed from the wheel alone."""

    def __init__(self, venv: Path, home: Path) -> None:
        self.venv = venv
        self.home = home  # an empty working directory, outside the checkout

    @property
    def llamaswap(self) -> str:
        return str(self.venv / "bin" / "llamaswap")

    def env(self, marker: str = "") -> dict[str, str]:
        """The environment of a user's shell: no PYTHONPATH, and on PATH only the system's
        programs, so the fake model servers must start from ``${PYTHON}``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PATH"] = "/usr/bin:/bin"
        env[MARKER_VARIABLE] = marker or uuid.uuid4().hex
        return env

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.llamaswap, *args],
            capture_output=True, text=True, check=False, cwd=self.home, env=self.env(),
            timeout=60,
        )  # fmt: skip


def _pip(*args: str, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-m", "pip", "--quiet", *args],
        check=True, cwd=cwd, env=env, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel from a copy of the packaged files (setuptools' in-tree build/ could
    carry files deleted since), then install it into a new venv with its dependencies."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            shutil.copy(REPO / name, source / name)
    _pip("wheel", "--no-deps", "--wheel-dir", str(root / "dist"), str(source), cwd=root)
    (wheel,) = (root / "dist").glob("llamaswap-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # This environment's pip installs into the new one: no pip bootstrapped there.
    _pip("--python", str(venv / "bin" / "python"), "install", str(wheel), cwd=root)
    home = root / "home"
    home.mkdir()
    return Installed(venv, home)


def test_the_installed_package_is_the_wheels_not_the_checkouts(installed: Installed) -> None:
    where = "import llamaswap, llamaswap.cli as c; print(llamaswap.__file__, c.QUICKSTART_CONFIG)"
    done = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", where],
        capture_output=True, text=True, check=True, cwd=installed.home, env=installed.env(),
    )  # fmt: skip
    package, example = done.stdout.split()
    assert Path(package).is_relative_to(installed.venv)
    assert Path(example).read_bytes() == (REPO / "llamaswap" / "quickstart.toml").read_bytes()


def test_version_is_llamaswaps_one_version_and_fast(installed: Installed) -> None:
    best = float("inf")
    for _ in range(3):  # the best of three: the machine may be busy with other tests
        start = time.perf_counter()
        done = installed.run("--version")
        best = min(best, time.perf_counter() - start)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"llamaswap {llamaswap.__version__}\n"
    assert best < 0.3, f"llamaswap --version took {best:.3f} s"


def test_check_config_accepts_the_bundled_example(installed: Installed) -> None:
    printed = installed.run("quickstart", "--print-config")
    assert printed.returncode == 0, printed.stderr
    config = installed.home / "config.toml"
    config.write_text(printed.stdout, encoding="utf-8")
    done = installed.run("check-config", str(config))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{config}: ok\n", "")


def test_import_config_translates_a_llama_swap_config(installed: Installed) -> None:
    output = installed.home / "imported.toml"
    done = installed.run("import-config", str(FIXTURE), "-o", str(output))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].endswith("3 keys not translated (listed above)")
    assert output.read_text(encoding="utf-8").count("[models.") >= 2


async def test_quickstart_serves_a_chat_and_the_dashboard(installed: Installed) -> None:
    marker = uuid.uuid4().hex
    argv = [installed.llamaswap, "quickstart", "--listen", "127.0.0.1:0"]
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=installed.env(marker), cwd=installed.home,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        output = collected(nursery, process)
        try:
            with trio.fail_after(20):
                url = (await output.wait_for(LISTENING.pattern))["url"]
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                with trio.fail_after(60):
                    answer = await client.post("/v1/chat/completions", json=chat("chat"))
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["choices"][0]["message"]["content"]
                    page = await client.get("/", follow_redirects=True)
                    assert page.status_code == 200
                    assert page.headers["content-type"].startswith("text/html")
                    script = re.search(r'src="(js/[a-z]+\.js)"', page.text)
                    assert script is not None, page.text
                    asset = await client.get(f"/ui/{script[1]}")
                    assert asset.status_code == 200
                    assert asset.headers["content-type"].startswith("text/javascript")
                    assert asset.content == (REPO / "llamaswap" / "ui" / script[1]).read_bytes()
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await process.wait() == 0, output.text()
        finally:
            await stop(process, marker, grace=30)  # and nothing it started survives
