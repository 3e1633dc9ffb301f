"""The image of ``Containerfile``, built and run with Podman on this machine, offline.

No container registry is reachable here, so the base image is made from Debian's packages:
``mmdebstrap`` builds a minimal root with Python and tini, and ``podman import`` makes it
an image (once per machine: about a minute, most of it downloading packages; ``podman rmi
localhost/llamaswap-test-base:bookworm`` makes the next run build it again). The image is
built on it with the wheels of llamaswap and its dependencies in the context (no PyPI in
the build), run with a config mounted at ``/config/config.toml``, and asked for a chat
completion that the fake model server inside answers.

What this machine needs of Podman, and why (docs/deploy.md says the same):

* ``--runtime runc`` where runc is installed: crun 1.8 refuses this machine's cgroups
  ("cgroups in hybrid mode not supported": v1 controllers with a v2 mount beside them);
* ``--ulimit nofile=… --ulimit nproc=…`` below this machine's hard limits: Podman's
  default (nofile 1048576, and nproc at the hard limit) is refused by setrlimit
  ("operation not permitted").
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.e2e.harness import LISTENING, REPO, collected, free_port_base
from tests.e2e.test_proxy import chat

BASE_IMAGE = "localhost/llamaswap-test-base:bookworm"
#: Debian's python3 (3.11 in bookworm, as this machine's, so the dependencies' wheels built
#: here fit), its venv module, and tini for the image's init.
BASE_PACKAGES = "python3,python3-venv,tini"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: What Containerfile's build stage builds llamaswap from (and .dockerignore lets in).
SOURCES = ("Containerfile", ".dockerignore", "pyproject.toml", "README.md", "llamaswap")
LIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
CONFIG = """
[models.chat]
cmd = "${PYTHON} -m llamaswap.fake_server --port ${PORT} --model-name ${MODEL_ID}"
"""


def _missing() -> str | None:
    """Why this test cannot run here, or ``None``."""
    for program in ("podman", "mmdebstrap"):
        if shutil.which(program) is None:
            return (
                f"no {program}: apt-get install -y podman mmdebstrap runc "
                "(./scripts/check does, as root with apt)"
            )
    if os.geteuid() != 0:
        return "builds the base root with mmdebstrap and runs podman as root"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``podman`` with this machine's runtime; raises with its output when it fails."""
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    done = subprocess.run(
        ["podman", *runtime, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"podman {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def _base_image() -> str:
    """The Debian base image, built with mmdebstrap and imported unless already there."""
    exists = subprocess.run(["podman", "image", "exists", BASE_IMAGE], check=False)
    if exists.returncode == 0:
        return BASE_IMAGE
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "root.tar"
        argv = ["mmdebstrap", "--variant=essential", f"--include={BASE_PACKAGES}"]
        argv += ["bookworm", str(root), DEBIAN_MIRROR]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:  # the machine's (no mirror, no chroot), not the image's
            pytest.skip(f"mmdebstrap cannot build a Debian root here:\n{done.stderr[-2000:]}")
        podman("import", str(root), BASE_IMAGE)
    return BASE_IMAGE


def _can_run_containers(base: str) -> None:
    """Skip, saying podman's own words, where this machine runs no container at all (a
    sandbox without user namespaces or cgroups): the image is not what failed then."""
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    argv = ["podman", *runtime, "run", "--rm", *LIMITS, base, "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.skip(f"podman runs no container here: {done.stderr.strip()[-2000:]}")


def _context(directory: Path) -> Path:
    """A build context: the package's sources and, in ``wheels/``, llamaswap's wheel with
    its dependencies' and setuptools' (the build stage builds llamaswap from source)."""
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, directory / name, ignore=ignore)
        else:
            shutil.copy(REPO / name, directory / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wheels = str(directory / "wheels")
    setuptools = ["--only-binary", ":all:", "setuptools>=77"]
    for pip in (["wheel", "--wheel-dir", wheels, str(directory)],
                ["download", "--dest", wheels, *setuptools]):  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "pip", "--quiet", *pip], check=True, env=env, timeout=600
        )
    return directory


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = _base_image()
    _can_run_containers(base)
    context = _context(tmp_path_factory.mktemp("context"))
    tag = f"localhost/llamaswap-test:{uuid.uuid4().hex[:12]}"
    podman(
        # docker's format keeps the HEALTHCHECK; no layers kept: no stage image left behind
        "build", *LIMITS, "--format", "docker", "--layers=false",
        "--build-arg", f"BASE={base}",
        "--build-arg", "PIP_OPTIONS=--no-index --find-links /src/wheels",
        "--tag", tag, "--file", str(context / "Containerfile"), str(context),
        timeout=900,
    )  # fmt: skip
    yield tag
    podman("rmi", "--force", tag)


async def test_the_image_serves_a_request_and_stops_on_sigterm(image: str, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG, encoding="utf-8")
    config.chmod(0o644)  # the container's user is not this one
    port = free_port_base(1)
    name = f"llamaswap-test-{uuid.uuid4().hex[:12]}"
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    argv = ["podman", *runtime, "run", "--rm", "--name", name, *LIMITS]
    argv += ["--publish", f"127.0.0.1:{port}:8080"]
    argv += ["--volume", f"{config}:/config/config.toml:ro", image]
    # In the foreground, as `podman run` is used: the container's logs are its output, and
    # a signal to podman is passed on to the container's PID 1.
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    async with trio.open_nursery() as nursery:
        output = collected(nursery, process)
        try:
            with trio.fail_after(60):
                listening = await output.wait_for(LISTENING.pattern)
            assert listening["url"] == "http://0.0.0.0:8080"
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=30
            ) as client:
                with trio.fail_after(60):
                    answer = await client.post("/v1/chat/completions", json=chat("chat"))
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"]
            await trio.to_thread.run_sync(podman, "healthcheck", "run", name)  # the HEALTHCHECK
            init = (
                await trio.to_thread.run_sync(podman, "exec", name, "cat", "/proc/1/cmdline")
            ).stdout.split("\0")
            assert init[:3] == ["tini", "--", "llamaswap"]
            user = await trio.to_thread.run_sync(podman, "exec", name, "id", "-u")
            assert user.stdout.strip() == "10001"
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await process.wait() == 0, output.text()
            assert "model 'chat': stopped" in output.text()
        finally:
            with trio.CancelScope(shield=True):
                remove = ["podman", "rm", "--force", name]
                await trio.run_process(
                    remove, capture_stdout=True, capture_stderr=True, check=False
                )
                if process.returncode is None:
                    process.kill()
                    await process.wait()
