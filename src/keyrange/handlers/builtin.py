"""The built-in handlers: `sleep` (the kata's 10 ms of work), `ledger` (order-sensitive state), `noop`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from keyrange.handlers.marks import inline

AsyncHandler = Callable[[dict[str, Any], Any], Awaitable[Any]]


def _number(config: dict[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{key} must be a non-negative number, got {value!r}")
    return float(value)


def _only(config: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ValueError(f"unknown keys {unknown}; allowed: {sorted(allowed)}")


def sleep_handler(config: dict[str, Any]) -> AsyncHandler:
    """Simulated I/O like the kata's ClientProjection: sleep ~N(meanMs, stddevMs), return nothing."""
    _only(config, {"meanMs", "stddevMs"})
    mean_s = _number(config, "meanMs", 10.0) / 1000
    stddev_s = _number(config, "stddevMs", 1.0) / 1000
    gauss = random.Random().gauss

    async def sleep(event: dict[str, Any], ctx: Any) -> None:
        await asyncio.sleep(max(0.0, gauss(mean_s, stddev_s)) if stddev_s else mean_s)

    return sleep


def ledger_handler(config: dict[str, Any]) -> Callable[[dict[str, Any], Any], Any]:
    """Per-client counter in keyed state: `increment` adds `amount`, `drain` resets to 0.

    result = {"value": counter after, "returned": the new value (increment) or the drained one}.
    Without `delayMs` it only computes, so it runs inline on the worker's loop; with it, it is a
    coroutine that sleeps first (simulated I/O).
    """
    _only(config, {"delayMs"})
    delay_s = _number(config, "delayMs", 0.0) / 1000

    def ledger(event: dict[str, Any], ctx: Any) -> dict[str, int]:
        op = event.get("op")
        counter = int(ctx.state.get(0))
        if op == "increment":
            amount = event.get("amount")
            if isinstance(amount, bool) or not isinstance(amount, int):
                raise ValueError(f"ledger increment needs an integer amount, got {amount!r}")
            counter += amount
            ctx.state.set(counter)
            return {"value": counter, "returned": counter}
        if op == "drain":
            ctx.state.set(0)
            return {"value": 0, "returned": counter}
        raise ValueError(f"ledger op must be 'increment' or 'drain', got {op!r}")

    if not delay_s:
        return inline(ledger)

    async def delayed_ledger(event: dict[str, Any], ctx: Any) -> dict[str, int]:
        await asyncio.sleep(delay_s)
        return ledger(event, ctx)

    return delayed_ledger


def noop_handler(config: dict[str, Any]) -> Callable[[dict[str, Any], Any], None]:
    """Does nothing, inline (for measuring the engine's own overhead)."""
    _only(config, set())

    @inline
    def noop(event: dict[str, Any], ctx: Any) -> None:
        return None

    return noop
