"""Observing handler calls themselves, committed or not: a sync handler that notes the start and end
of every call (and can hold a chosen call until the test lets it return), and the check that calls of
one client never overlap (docs/design.md, guarantee 1)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

HOLD_SECONDS = 60.0
"""The longest a held call waits for the test to let it return (a failed test must not hang)."""


@dataclass
class Call:
    """One handler call: which event and attempt, on which worker, when it started and ended."""

    client: int
    offset: int
    attempt: int
    worker: str
    started: float
    """time.monotonic() at its start."""
    ended: float | None = None
    """time.monotonic() when it returned; None while it runs."""


class CallLog:
    """A sync handler (`handler`) that logs every call; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._held: dict[tuple[int, int], threading.Event] = {}

    def hold(self, offset: int, attempt: int) -> None:
        """Hold the call of the event at `offset`, attempt `attempt`, until `let_return`."""
        self._held[(offset, attempt)] = threading.Event()

    def let_return(self, offset: int, attempt: int) -> None:
        """Let a held call return."""
        self._held[(offset, attempt)].set()

    def let_all_return(self) -> None:
        """Let every held call return (a test's cleanup)."""
        for gate in self._held.values():
            gate.set()

    def handler(self, event: dict[str, Any], ctx: Any) -> dict[str, Any]:
        """The handler: notes the call's start and end, held in between when asked to."""
        call = Call(ctx.client_id, ctx.offset, ctx.attempt, ctx.worker, time.monotonic())
        with self._lock:
            self._calls.append(call)
        gate = self._held.get((ctx.offset, ctx.attempt))
        if gate is not None:
            gate.wait(HOLD_SECONDS)
        time.sleep(0.001)
        call.ended = time.monotonic()
        return {"attempt": ctx.attempt}

    def of(self, client: int) -> list[Call]:
        """The client's calls, in the order they started."""
        with self._lock:
            return [c for c in self._calls if c.client == client]

    def finished(self, client: int) -> list[Call]:
        """The client's calls that have returned."""
        return [c for c in self.of(client) if c.ended is not None]

    def all(self) -> list[Call]:
        """Every call, in the order they started."""
        with self._lock:
            return list(self._calls)


def assert_calls_never_overlap(calls: CallLog) -> None:
    """Each client's calls ran one at a time: every call started after the one before it ended."""
    by_client: dict[int, list[Call]] = {}
    for call in calls.all():
        by_client.setdefault(call.client, []).append(call)
    for client, mine in by_client.items():
        for before, after in itertools.pairwise(mine):
            assert before.ended is not None and after.started >= before.ended, (
                f"client {client}: {after} started while {before} still ran")

