"""A read-ahead running on its thread, and how the acquire that follows it takes what it read.

The new owner reads a handoff's moved slots ahead (restorer.py `Restorer.prefetch`) while the old
owner still handles them; the grant may come before the read ends (the controller waited out its
read-ahead timeout, or the machine is slow). The acquire then waits for the read-ahead only while
it initialises the slots' producers, and cuts it short after that: the read returns at its next
batch with what it read so far, and the acquire's catch-up (`Restorer.restore_slots`) reads on from
there. So a read-ahead that reads slowly never holds the moved slots longer than their restore.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from keyrange.worker.restorer import Prefetched


class ReadAhead:
    """One read-ahead of `slots`, running `read(cut)` on the loop's default executor."""

    def __init__(self, slots: frozenset[int], read: Callable[[threading.Event], Prefetched]) -> None:
        self.slots = slots
        self._cut = threading.Event()
        self._future = asyncio.get_running_loop().run_in_executor(None, read, self._cut)

    async def wait(self) -> bool:
        """Wait for the read to end (cancelling this wait leaves it running): whether it read all it
        planned (False: it was cut short); raises what it raised."""
        await asyncio.shield(self._future)
        return not self._cut.is_set()

    def cut(self) -> None:
        """Have the read return at its next batch with what it read so far."""
        self._cut.set()

    async def finish(self) -> Prefetched | None:
        """What the read-ahead read, for the acquire: cut short if it still runs, None if it failed."""
        self.cut()
        try:
            return await self._future
        except Exception:  # noqa: BLE001 - its failure was logged by whoever awaited `wait`
            return None
