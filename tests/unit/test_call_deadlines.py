"""The handler calls' watchdog (worker/deadlines.py): which calls it cancels, and when a
cancellation counts as a timeout. Clocked by hand except where the watcher task itself is tested."""

from __future__ import annotations

import asyncio

import pytest

from keyrange.worker.deadlines import Call, CallDeadlines
from tests.unit.worker_fakes import FakeClock


async def _hang(deadlines: CallDeadlines, started: asyncio.Event, outcome: list[str]) -> None:
    call = deadlines.start()
    started.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        outcome.append("timeout" if deadlines.timed_out(call) else "cancelled")
        if outcome[-1] == "cancelled":
            raise
    finally:
        deadlines.finish(call)


def test_only_calls_past_their_deadline_are_cancelled_oldest_first() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        deadlines = CallDeadlines(10.0, clock)
        outcomes: list[list[str]] = [[], [], []]
        tasks = []
        for i in range(3):
            started = asyncio.Event()
            tasks.append(asyncio.create_task(_hang(deadlines, started, outcomes[i])))
            await started.wait()
            clock.now += 4  # calls start at 100, 104 and 108: deadlines 110, 114, 118
        clock.now = 114.0
        assert deadlines.expire_due() == 2
        await asyncio.gather(tasks[0], tasks[1])
        assert outcomes[:2] == [["timeout"], ["timeout"]]
        assert outcomes[2] == [] and not tasks[2].done()
        assert deadlines.expire_due() == 0  # nothing else due yet
        tasks[2].cancel()
        await asyncio.gather(tasks[2], return_exceptions=True)
        assert outcomes[2] == ["cancelled"]

    asyncio.run(scenario())


def test_a_call_that_finished_in_time_is_never_cancelled() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        deadlines = CallDeadlines(1.0, clock)
        call = deadlines.start()
        deadlines.finish(call)
        clock.now += 5
        assert deadlines.expire_due() == 0
        await asyncio.sleep(0)  # no pending cancellation reaches this task

    asyncio.run(scenario())


def test_another_cancel_of_the_same_task_is_not_taken_for_a_timeout() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        deadlines = CallDeadlines(1.0, clock)
        started = asyncio.Event()
        outcome: list[str] = []
        task = asyncio.create_task(_hang(deadlines, started, outcome))
        await started.wait()
        clock.now += 2
        task.cancel()  # e.g. the worker shutting down, in the same loop pass as the deadline
        assert deadlines.expire_due() == 1
        with pytest.raises(asyncio.CancelledError):
            await task
        assert outcome == ["cancelled"]

    asyncio.run(scenario())


def test_a_handler_that_swallows_its_cancellation_is_cancelled_once() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        deadlines = CallDeadlines(1.0, clock)
        call: list[Call] = []
        cancels = 0

        async def stubborn() -> None:
            nonlocal cancels
            call.append(deadlines.start())
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels += 1  # swallowed: the call goes on
            try:
                await asyncio.sleep(3600)
            finally:
                deadlines.finish(call[0])

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        clock.now += 2
        assert deadlines.expire_due() == 1
        assert deadlines.expire_due() == 0
        await asyncio.sleep(0)
        assert cancels == 1 and not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_the_watcher_task_cancels_on_time_and_stops_when_no_call_runs() -> None:
    async def scenario() -> None:
        deadlines = CallDeadlines(0.05)
        started = asyncio.Event()
        outcome: list[str] = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.wait_for(_hang(deadlines, started, outcome), 5)
        assert outcome == ["timeout"]
        assert loop.time() - t0 >= 0.05
        for _ in range(100):  # the watcher ends on its own once nothing runs
            if deadlines._watcher is None:
                break
            await asyncio.sleep(0.01)
        assert deadlines._watcher is None
        finished = deadlines.start()  # a later call starts a new watcher
        assert deadlines._watcher is not None
        deadlines.finish(finished)

    asyncio.run(scenario())
