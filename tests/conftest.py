"""Fixtures shared by every tier: the real embedded broker and unique topic names."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from keyrange.local.broker import EmbeddedBroker

_names = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """One embedded tansu broker for the whole session (in-memory; tests use unique topics)."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def bootstrap(broker: EmbeddedBroker) -> str:
    """Bootstrap address of the session broker."""
    return broker.bootstrap


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (tansu auto-creates unknown topics, so names never repeat)."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    return f"{base}-{os.getpid()}-{next(_names)}"
