"""Long Python loops on a worker's side threads that leave the interpreter to its event loop now and then.

A restore parses thousands of records (a read-ahead tens of thousands) on a thread of its own while
the worker's event loop goes on handling the slots that did not move. CPython runs one thread's
Python code at a time: a thread that never waits keeps the interpreter lock, and a thread that
wants it back (the event loop woken by a fetch, a commit or a handler call that returned) gets it
only when the holder is made to drop it, after the switch interval (5 ms), once per wake-up. An
event loop wakes up several times per batch of events, so beside a parsing thread it ran a tenth
of its rounds or fewer (BENCHMARKS.md, "A restore beside the event loop"): every slot of the worker
slowed down while one was acquired.

A `Pacer` makes such a loop step aside for a moment after each slice of its own running time:
a thread waiting for the lock takes it then and keeps it until it waits again, so the event loop
runs its rounds at once and the parsing thread goes on when the loop is idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

SLICE_SECONDS = 0.0005
"""How long a paced loop runs before it steps aside (a tenth of CPython's switch interval)."""
STEP_ASIDE_SECONDS = 0.00005
"""How long it steps aside: long enough for a waiting thread to wake and take the lock."""
CHECK_EVERY = 32
"""Items between two looks at the clock (a look costs about what a cheap item does)."""


class Pacer:
    """Steps aside (sleeps STEP_ASIDE_SECONDS) after each SLICE_SECONDS of a loop's running time
    (module docstring). One per thread: it keeps when it last stepped aside."""

    def __init__(self, slice_seconds: float = SLICE_SECONDS, step_aside_seconds: float = STEP_ASIDE_SECONDS,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._slice = slice_seconds
        self._step_aside = step_aside_seconds
        self._clock = clock
        self._sleep = sleep
        self._since = clock()

    def paced(self, items: Iterable[T]) -> Iterator[T]:
        """`items`, stepping aside between two of them whenever a slice has run out."""
        for n, item in enumerate(items, 1):
            if n % CHECK_EVERY == 0:
                self.tick()
            yield item

    def tick(self) -> None:
        """Step aside if the slice since the last time has run out."""
        now = self._clock()
        if now - self._since >= self._slice:
            self._sleep(self._step_aside)
            self._since = self._clock()
