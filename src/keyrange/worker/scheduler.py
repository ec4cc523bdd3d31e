"""Per-client serial execution with a global concurrency limit and no head-of-line blocking.

Each client with work has its own FIFO queue and one drain coroutine that runs the client's
items one at a time in submission (log) order; a semaphore caps how many items run at once
across all clients. A slow client only ever holds one permit, so the others keep flowing.
There are no fixed lanes shared by clients and no asyncio Task per item: a drain coroutine is
started when a client goes from idle to busy and ends when its queue is empty.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

YIELD_EVERY_ITEMS = 64
"""A drain coroutine whose handler never suspends yields to the loop this often, so fetching
and committing are not starved by one long queue."""


class ClientScheduler(Generic[T]):
    """Runs `run(item)` for submitted items: serially per client, `concurrency` at most overall."""

    def __init__(
        self,
        run: Callable[[T], Awaitable[None]],
        concurrency: int,
        skip: Callable[[T], bool] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._run = run
        self._skip = skip
        self._free = concurrency
        # Drains waiting for a permit, first come first served; a plain counter and a deque of
        # futures because asyncio.Semaphore costs two coroutine calls per item on the hot path.
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._queues: dict[Hashable, deque[T]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._queued = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop every drain runs on (all submits come from one loop)."""

    @property
    def active_clients(self) -> int:
        """Clients with queued or running items."""
        return len(self._queues)

    @property
    def queued(self) -> int:
        """Items submitted and not yet finished (running ones included)."""
        return self._queued

    def can_run_now(self, client_id: Hashable) -> bool:
        """True when an item of `client_id` may run at once, outside the queues: the client has
        nothing queued or running (its order holds) and a permit is free with nobody waiting."""
        return client_id not in self._queues and self._free > 0 and not self._waiting

    def submit(self, client_id: Hashable, item: T) -> None:
        """Queue `item` behind the client's earlier items; start the client's drain if idle."""
        self._queued += 1
        self._idle.clear()
        queue = self._queues.get(client_id)
        if queue is not None:
            queue.append(item)
            return
        queue = deque((item,))
        self._queues[client_id] = queue
        loop = self._loop
        if loop is None:
            # Looked up once: Python 3.11 finds the running loop by comparing the process id, a
            # getpid system call (2% of a worker's event loop on the ledger benchmark, once per
            # client going busy).
            loop = self._loop = asyncio.get_running_loop()
        task = loop.create_task(self._drain(client_id, queue))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Return once every submitted item has finished or been skipped."""
        await self._idle.wait()

    async def cancel(self) -> None:
        """Cancel every drain coroutine (used when the worker dies, not on a graceful stop)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _drain(self, client_id: Hashable, queue: deque[T]) -> None:
        skip = self._skip
        since_yield = 0
        try:
            while queue:
                item = queue[0]
                if skip is not None and skip(item):
                    queue.popleft()
                    self._finished()
                    continue
                if self._free > 0 and not self._waiting:
                    self._free -= 1
                else:
                    await self._wait_for_permit()
                try:
                    queue.popleft()
                    await self._run(item)
                except Exception:
                    # `run` handles its own failures (retries, dead letters); anything that
                    # escapes is a bug, logged so that one item cannot stop its client's queue.
                    log.exception("unexpected error running an item of client %s", client_id)
                finally:
                    self._release_permit()
                    self._finished()
                since_yield += 1
                if since_yield >= YIELD_EVERY_ITEMS:
                    since_yield = 0
                    await asyncio.sleep(0)
        finally:
            del self._queues[client_id]

    async def _wait_for_permit(self) -> None:
        assert self._loop is not None, "a drain runs only after a submit"
        waiter = self._loop.create_future()
        self._waiting.append(waiter)
        try:
            await waiter  # the releaser handed its permit over to this waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release_permit()  # handed over, but this drain is gone: pass it on
            raise

    def _release_permit(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def _finished(self) -> None:
        self._queued -= 1
        if self._queued == 0:
            self._idle.set()
