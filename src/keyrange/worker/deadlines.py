"""One watchdog for the deadlines of every running handler call.

`asyncio.timeout` per call costs a timer handle pushed on the loop's heap and cancelled again for
every event, a large share of the event loop's time (BENCHMARKS.md). Every call gets the
same timeout, so deadlines fall in the order calls start, and the oldest running call is the
first entry of an insertion-ordered dict. One watcher task sleeps until that deadline, cancels
the calls whose deadline passed, and sleeps until the next one: a call costs a dict insert and
delete, and the watcher wakes about once per timeout while calls keep finishing in time.

A cancelled call is told apart from any other cancellation of its task the way `asyncio.timeout`
does it: the watchdog marks the call expired, and the call's own `CancelledError` becomes a
timeout only if no other cancel request is pending on the task (`Task.uncancel`).

The current task is looked up on the loop the first call ran on: Python 3.11's
`asyncio.current_task()` without a loop finds the running loop by comparing the process id, a
`getpid` system call per handler call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Call:
    """One running call: its task, deadline, and whether the watchdog cancelled it."""

    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[object], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        self.cancelling = task.cancelling()
        self.expired = False


class CallDeadlines:
    """Cancels calls still running `timeout_seconds` after they started (module docstring)."""

    def __init__(self, timeout_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_seconds = timeout_seconds
        self._clock = clock
        self._running: dict[asyncio.Task[object], Call] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> Call:
        """Note a call starting in the current task; pair with `finish`. Every call runs on one loop."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None, "handler calls run in a task of the loop the first one ran on"
        call = Call(task, self._clock() + self.timeout_seconds)
        self._running[task] = call
        if self._watcher is None:
            self._watcher = loop.create_task(self._watch())
        return call

    def finish(self, call: Call) -> None:
        """The call returned, failed or was cancelled."""
        if self._running.get(call.task) is call:
            del self._running[call.task]

    def timed_out(self, call: Call) -> bool:
        """In the call's `except CancelledError`: True if this cancellation is the deadline's alone."""
        return call.expired and call.task.uncancel() <= call.cancelling

    def expire_due(self) -> int:
        """Cancel every call whose deadline has passed; how many were cancelled."""
        now, expired = self._clock(), 0
        while self._running:
            task, call = next(iter(self._running.items()))
            if call.deadline > now:
                break
            # Out of the dict at once: a handler that swallows the cancellation must not keep
            # the watcher cancelling it in a loop.
            del self._running[task]
            call.expired = True
            task.cancel()
            expired += 1
        return expired

    async def _watch(self) -> None:
        try:
            while self._running:
                oldest = next(iter(self._running.values()))
                delay = oldest.deadline - self._clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    self.expire_due()
        finally:
            self._watcher = None
