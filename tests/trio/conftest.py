"""Fixtures of the Trio tier: fake processes, and a record of model states."""

from __future__ import annotations

import pytest
import trio

from tests.fakes import FakeSpawner, Script, StateRecorder


@pytest.fixture
def spawner(nursery: trio.Nursery) -> FakeSpawner:
    """Fake model servers that turn healthy one second after they start."""
    return FakeSpawner(nursery, Script(healthy_after=1.0))


@pytest.fixture
def recorder() -> StateRecorder:
    return StateRecorder()
