"""User handlers loaded by the worker tests as `module:function`, like a user's own code."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from keyrange.handlers import inline
from keyrange.handlers.builtin import ledger_handler

FAIL_MARK = "fail-always"
"""Events whose body has `"mode": FAIL_MARK` make the handlers below raise on every attempt."""
FAIL_FIRST_MARK = "fail-first"
"""Events whose body has `"mode": FAIL_FIRST_MARK` make `inline_counter` raise on their first attempt."""


def sync_counter(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A sync handler (runs in the worker's thread pool): keyed count of the client's events."""
    if event.get("mode") == FAIL_MARK:
        raise RuntimeError("this event always fails")
    time.sleep(0.001)
    count = ctx.state.get(0) + 1
    ctx.state.set(count)
    return {"count": count, "thread": threading.current_thread().name.split("_")[0]}


@inline
def inline_counter(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """An inline handler (its first attempt on the worker's loop): keyed count of the client's events."""
    if event.get("mode") == FAIL_MARK or (event.get("mode") == FAIL_FIRST_MARK and ctx.attempt == 1):
        raise RuntimeError("this attempt fails")
    count = ctx.state.get(0) + 1
    ctx.state.set(count)
    return {"count": count, "attempt": ctx.attempt, "thread": threading.current_thread().name.split("_")[0]}


_ledger = ledger_handler({})
BUSY_INLINE_LEDGER_SECONDS = 0.0003
"""CPU each `busy_inline_ledger` call spins for: a fetched batch of 1,000 then holds the worker's
loop for 0.3 s, and one worker keeps up with at most about 3,000 events/s."""


@inline
def busy_inline_ledger(event: dict[str, Any], ctx: Any) -> Any:
    """The built-in ledger, inline, after spinning BUSY_INLINE_LEDGER_SECONDS: an inline handler
    slower than it should be, which holds up the worker's fetches, commits and handoff steps."""
    until = time.perf_counter() + BUSY_INLINE_LEDGER_SECONDS
    while time.perf_counter() < until:
        pass
    return _ledger(event, ctx)


async def async_counter(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """An async handler (awaited on the worker's loop): keyed count of the client's events."""
    if event.get("mode") == FAIL_MARK:
        raise RuntimeError("this event always fails")
    await asyncio.sleep(0.001)
    count = ctx.state.get(0) + 1
    ctx.state.set(count)
    return {"count": count, "attempt": ctx.attempt}


async def mutating_counter(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Mutates the object `ctx.state.get` returns in place before deciding: a first attempt
    bumps it and fails, and every attempt also scribbles on it without `set`. Neither may reach
    the retry, memory or the changelog: each attempt must see the state as committed."""
    state = ctx.state.get({"count": 0, "scribbles": 0})
    state["scribbles"] += 1  # never `set` on its own: must not stick
    state["count"] += 1
    if ctx.attempt == 1:
        raise RuntimeError("first attempts fail after mutating the state they were given")
    ctx.state.set({"count": state["count"], "scribbles": 0})
    return {"count": state["count"], "attempt": ctx.attempt}


async def hangs_on_mark(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Never returns for events marked `"mode": "hang"`; counts the others."""
    if event.get("mode") == "hang":
        await asyncio.Event().wait()
    count = ctx.state.get(0) + 1
    ctx.state.set(count)
    return {"count": count}


def sleeps_on_mark(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A sync handler that sleeps `sleepS` for events marked `"mode": "slow"` (its thread is stuck)."""
    if event.get("mode") == "slow":
        time.sleep(float(event["sleepS"]))
    return {"ok": True}


async def huge_on_mark(event: dict[str, Any], ctx: Any) -> Any:
    """Returns a result too large for a Kafka record for events marked `"mode": "huge"`."""
    if event.get("mode") == "huge":
        return "x" * 2_000_000
    if event.get("mode") == "huge-state":
        ctx.state.set("y" * 2_000_000)
        return {"stored": True}
    return {"ok": True}


async def blocks_the_loop(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """An async handler that (wrongly) blocks the event loop for `blockS` on marked events."""
    if event.get("mode") == "block":
        time.sleep(float(event["blockS"]))
    return {"ok": True}


BLOCK_CLIENT = 4242
"""The client `blocks_one_client` holds up until `release_blocked` is set."""
release_blocked = threading.Event()


async def blocks_one_client(event: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Holds BLOCK_CLIENT's events until `release_blocked`, then fails them (a released slot's
    failed attempt is not retried here: its offset stays unfinished for the next owner)."""
    if event["clientId"] == BLOCK_CLIENT:
        while not release_blocked.is_set():
            await asyncio.sleep(0.01)
        raise RuntimeError("released while blocked")
    return {"ok": True}
