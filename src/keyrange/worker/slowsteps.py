"""Steps of a handoff that wait on something outside the worker's control (handler calls, the
consumer's thread, a transaction in flight, a restore) say so while they wait: a release or an
acquire that hangs names what it waits for in the log, instead of a slot that silently shows lag
with nothing pending."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

log = logging.getLogger("keyrange.worker.engine")

T = TypeVar("T")

SLOW_STEP_SECONDS = 15.0
"""A step still waiting after this long is reported, and again after each further such wait."""


async def reported_if_slow(step: Awaitable[T], what: str, every: float = SLOW_STEP_SECONDS) -> T:
    """Await `step`; log a warning naming `what` each `every` seconds it is still waiting. Cancelled,
    it cancels `step` too."""
    task = asyncio.ensure_future(step)
    began = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            log.warning("%s: still waiting after %.0f s", what, time.monotonic() - began)
    except asyncio.CancelledError:
        task.cancel()
        raise
