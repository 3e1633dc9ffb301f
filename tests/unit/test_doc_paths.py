"""The docs name only files the repository has: every path in a `code span` or a link of
README.md, docs/*.md and the examples' READMEs exists (tests/trio/test_docs.py checks that
they cover every config key and route)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("examples/**/README.md")])
#: Code blocks: their commands name what they create (``examples/models/tiny-a.gguf``).
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: A path from the repository's root: ``llamaswap/proxy/app.py``, ``tests/e2e/``.
ROOTED = re.compile(r"(?<![\w./-])(?:docs|examples|llamaswap|scripts|tests)/[\w./*-]*")
#: A file named on its own, or by its last folders: ``validate.py``, ``router/lease.py``.
FILE = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.(?:py|toml|md|js|css|html|json|yaml|yml|svg|png)")
#: Files the docs name that are not the repository's: the user's, or other programs'.
NOT_OURS = {
    "config.example.yaml",  # llama-swap's example config
    "devices.json",  # what a test writes for the fake GPU probe
    "DIR/devices.json",
    "DIR/PID.json",
}


def exists(path: str) -> bool:
    """Whether ``path`` (from the repository's root; ``*`` as in a glob) is there."""
    path = path.rstrip(".,:;")
    return any(REPO.glob(path)) if "*" in path else (REPO / path).exists()


def prose(doc: Path) -> str:
    return FENCED.sub("", doc.read_text(encoding="utf-8"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_every_repository_path_in_a_code_span_exists(doc: Path) -> None:
    spans = SPAN.findall(prose(doc))
    named = {path for span in spans for path in ROOTED.findall(span) if "..." not in path}
    assert sorted(path for path in named if not exists(path)) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_every_local_link_leads_to_a_file(doc: Path) -> None:
    targets = {
        link.partition("#")[0]
        for link in LINK.findall(prose(doc))
        if not re.match(r"[a-z]+:", link)  # https:, mailto:
    }
    missing = [t for t in targets if t and not (doc.parent / t).resolve().exists()]
    assert sorted(missing) == []


def test_every_file_named_in_a_code_span_is_one_of_the_repositorys() -> None:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    named = {
        (doc.relative_to(REPO), name)
        for doc in DOCS
        for span in SPAN.findall(prose(doc))
        if FILE.fullmatch(name := span.partition("::")[0].partition("#")[0])  # ids, anchors
        and name not in NOT_OURS
    }
    missing = [
        f"{doc}: {name}"
        for doc, name in named
        if not any(file == name or file.endswith(f"/{name}") for file in files)
    ]
    assert sorted(missing) == []
