"""reported_if_slow (slowsteps.py): a handoff step that waits long says what it waits for."""

from __future__ import annotations

import asyncio
import logging

import pytest

from keyrange.worker.slowsteps import reported_if_slow


async def test_a_slow_step_is_reported_while_it_waits_and_returns_its_result(caplog: pytest.LogCaptureFixture) -> None:
    async def slow() -> int:
        await asyncio.sleep(0.25)
        return 7

    with caplog.at_level(logging.WARNING):
        assert await reported_if_slow(slow(), "releasing slots [3]: the transaction in flight", every=0.1) == 7
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) == 2 and all(m.startswith("releasing slots [3]: the transaction in flight: still waiting after")
                                   for m in waits), waits


async def test_a_quick_step_says_nothing_and_its_error_passes_through(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise ValueError("no")

    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="no"):
        await reported_if_slow(fails(), "x", every=0.1)
    assert caplog.records == []


async def test_cancelling_the_wait_cancels_the_step() -> None:
    step = asyncio.ensure_future(asyncio.sleep(10))
    waiting = asyncio.ensure_future(reported_if_slow(step, "x", every=0.05))
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0)
    assert step.cancelled()
