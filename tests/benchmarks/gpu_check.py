"""Issue 28's check on a real GPU: NVML figures learned, a fit-based swap, a CUDA
out-of-memory retried.

    python tests/benchmarks/gpu_check.py            # on a machine with an NVIDIA GPU,
                                                    # PyTorch and nvidia-ml-py
    python tests/benchmarks/gpu_check.py --fake     # anywhere: the probe's test double

Models are fake servers (``python -m llamaswap.fake_server``) that hold a stated amount of
GPU memory once loaded: ``--cuda`` allocates it for real with PyTorch (so NVML's
per-process figures and CUDA's out-of-memory errors are the real ones); with ``--fake``
they "allocate" in a ``FileProbe`` folder instead, which checks this script's logic on a
machine without a GPU. Sizes are fractions of gpu0's budget as ``/api/resources`` reports
it, so the script fits any GPU:

1. ``a`` declares nothing and holds 20%: its figure is *learned* (NVML's per-process
   memory of its process tree, which includes PyTorch's CUDA context).
2. ``b`` declares and holds 30%: it fits beside ``a``, so nothing is evicted.
3. ``c`` declares and holds 60%: it fits beside one of them only; exactly one is
   evicted (the one cheaper to load again).
4. ``d`` declares 5% but holds 50%: by the figures it fits, so nothing is evicted, and
   its start fails with CUDA's out-of-memory error; llamaswap retries once after evicting
   every idle model, and the load succeeds.

Prints each step's figures and a verdict, and writes them as JSON to ``$OUT/gpu_check.json``
when ``OUT`` is set (the device machine's output folder). Exit status 1 if a check failed.

On the lent GPU machine (PyTorch and nvidia-ml-py, no network), llamaswap's own
dependencies travel with the tree: build them here with
``pip install --target .gpudeps trio hypercorn quart-trio httpx cattrs tomli
prometheus-client`` (for the device's Python version: ``--python-version 3.X
--only-binary=:all:``), carry ``.gpudeps`` and run
``PYTHONPATH=.gpudeps:. python tests/benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


def free_port() -> int:
    """A free port below the ephemeral range, to start the fake servers' ports at."""
    for port in range(21000, 32000, 37):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32000")


class Proxy:
    """A llamaswap process on ``config``, answering on the URL it prints."""

    def __init__(self, config: str, env: dict[str, str], folder: Path) -> None:
        path = folder / "config.toml"
        path.write_text(config)
        self.log = folder / "llamaswap.log"
        self._log_file = self.log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llamaswap", "--config", str(path), "--listen", "127.0.0.1:0"],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if "listening on http://" in line:
                    self.url = line.split("listening on ")[1].strip()
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"llamaswap exited: {self.log.read_text()}")
            time.sleep(0.05)
        raise RuntimeError("llamaswap did not start listening within 60 s")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=300) as answer:
            return json.loads(answer.read())

    def post(self, path: str) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, method="POST", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def running(self) -> set[str]:
        return {entry["model"] for entry in self.get("/running")["running"]}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake", action="store_true", help="the probe's test double, no GPU")
    parser.add_argument("--fake-total", default=80 * GiB, type=int, help="its gpu0, in bytes")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    env = dict(os.environ)
    if args.fake:
        gpu = folder / "gpu"
        gpu.mkdir()
        devices = {"gpu0": {"total": args.fake_total, "name": "Fake GPU"}}
        (gpu / "devices.json").write_text(json.dumps(devices))
        env["LLAMASWAP_FAKE_GPU"] = str(gpu)
        allocate = f"--gpu-dir {gpu}"
    else:
        env.pop("LLAMASWAP_FAKE_GPU", None)
        allocate = "--cuda"
    fake = f"{sys.executable} -m llamaswap.fake_server --port ${{PORT}} --model-name ${{MODEL_ID}}"
    results: dict[str, Any] = {"mode": "fake" if args.fake else "cuda"}
    checks: list[tuple[str, bool]] = []

    # First, the budget the probe reports: the sizes are fractions of it.
    probe = Proxy(f"startPort = {free_port()}\n", env, folder)
    try:
        device = probe.get("/api/resources")["devices"][0]
    finally:
        probe.stop()
    budget = device["budget"]
    results["device"] = device
    share = {name: int(budget * f) for name, f in (("a", 0.2), ("b", 0.3), ("c", 0.6), ("d", 0.5))}
    declared = {"b": share["b"], "c": share["c"], "d": int(budget * 0.05)}
    lines = [f"startPort = {free_port()}", "healthCheckTimeout = 300", "minResidency = 0"]
    for model in "abcd":
        lines += [f"[models.{model}]", f'cmd = "{fake} {allocate} --memory {share[model]}"']
        if model in declared:
            lines.append(f"memory = {declared[model]}")
    proxy = Proxy("\n".join(lines) + "\n", env, folder)
    try:
        # 1. a's figure is learned from NVML.
        started = time.monotonic()
        status, _ = proxy.post("/api/models/load/a")
        results["a_load_seconds"] = time.monotonic() - started
        deadline = time.monotonic() + 30
        a: dict[str, Any] = {}
        while time.monotonic() < deadline:
            a = proxy.get("/api/resources")["models"]["a"]
            if a["memory_source"] == "learned":
                break
            time.sleep(0.2)
        results["a"] = a
        learned = (a.get("memory") or {}).get("gpu0", 0)
        checks.append(("a's figure is learned from the probe", a["memory_source"] == "learned"))
        checks.append(("it is at least what a allocated", status == 200 and learned >= share["a"]))
        results["a_learned_over_allocated_bytes"] = learned - share["a"]

        # 2. b fits beside a.
        status, _ = proxy.post("/api/models/load/b")
        results["after_b"] = sorted(proxy.running())
        checks.append(("b loads beside a, nothing evicted", proxy.running() == {"a", "b"}))

        # 3. c evicts exactly one of them.
        status, _ = proxy.post("/api/models/load/c")
        after_c = proxy.running()
        results["after_c"] = sorted(after_c)
        checks.append(("c evicts exactly one of a, b", status == 200 and len(after_c) == 2))

        # 4. d runs out of memory, and the retry evicts the idle models.
        started = time.monotonic()
        status, _ = proxy.post("/api/models/load/d")
        results["d_status"], results["d_seconds"] = status, time.monotonic() - started
        results["after_d"] = sorted(proxy.running())
        log = proxy.log.read_text()
        retries = [line for line in log.splitlines() if "retrying the load of 'd'" in line]
        results["retry_log"] = retries
        checks.append(
            ("d's first start ran out of memory and was retried once", len(retries) == 1)
        )
        checks.append(
            ("the retry evicted the idle models and d serves", results["after_d"] == ["d"])
        )
        checks.append(("d's load answered 200", status == 200))
        results["resources"] = proxy.get("/api/resources")
    finally:
        proxy.stop()
    results["checks"] = [{"check": name, "ok": ok} for name, ok in checks]
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(json.dumps({k: v for k, v in results.items() if k != "resources"}, indent=1))
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps(results, indent=1))
        Path(out, "llamaswap.log").write_text(proxy.log.read_text())
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
