"""A worker's RangeMember rides out a control topic it cannot write to for a while (its partition
between leaders while a broker dies or restarts): it retries the round, it does not end the worker."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Set

from keyrange.ranges.channel import ControlState, ControlWriteFailed, Publication, WorkerReport
from keyrange.ranges.member import RangeMember
from keyrange.ranges.rangemap import RangeMap


class Engine:
    def __init__(self) -> None:
        self.held: set[int] = set()

    @property
    def held_slots(self) -> Set[int]:
        return self.held

    async def acquire(self, slots: Collection[int]) -> None:
        self.held |= set(slots)

    async def release(self, slots: Collection[int]) -> None:
        self.held -= set(slots)

    async def prefetch(self, slots: Collection[int]) -> bool:
        return True


class UnwritableChannel:
    """A control channel holding one publication whose first `failures` writes time out."""

    def __init__(self, publication: Publication, failures: int) -> None:
        self.state = ControlState(publication)
        self.failures = failures
        self.delivered: list[WorkerReport] = []

    def catch_up(self, timeout_seconds: float = 10.0) -> None:
        pass

    def poll(self, timeout_seconds: float = 0.0) -> int:
        return 0

    def report(self, report: WorkerReport) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ControlWriteFailed("control record to g.control not delivered within 10 s: timeout")
        self.delivered.append(report)


async def test_a_report_that_cannot_be_written_is_retried_not_fatal() -> None:
    engine = Engine()
    channel = UnwritableChannel(Publication(RangeMap.even(6, 2, epoch=3)), failures=3)
    member = RangeMember(engine, channel, 0, heartbeat_seconds=0.01, poll_seconds=0.01)  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(member.run(stop))

    async def reported_holding_its_slots() -> None:
        while not any(r.epoch == 3 and r.held == {0, 1, 2} for r in channel.delivered):
            assert not running.done(), f"the member ended: {running.exception()!r}"
            await asyncio.sleep(0.01)

    await asyncio.wait_for(reported_holding_its_slots(), 10)
    stop.set()
    await asyncio.wait_for(running, 10)
    assert member.applied_epoch == 3
    assert engine.held == {0, 1, 2}
