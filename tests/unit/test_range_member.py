"""A worker's RangeMember rides out a control topic it cannot write to for a while (its partition
between leaders while a broker dies or restarts): it retries the round, it does not end the worker.
And it acquires again a slot the engine let go by itself (its producer failed) while the newest
publication still gives it to this worker, and only then."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyrange.ranges.channel import (
    PREPARE_KEY,
    ControlState,
    ControlWriteFailed,
    Prepare,
    Publication,
    WorkerReport,
    describe_reports,
)
from keyrange.ranges.member import RangeMember
from keyrange.ranges.rangemap import RangeMap
from tests.slot_owner import FakeSlotOwner


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

    def report(self, report: WorkerReport) -> int:
        if self.failures > 0:
            self.failures -= 1
            raise ControlWriteFailed("control record to g.control not delivered within 10 s: timeout")
        self.delivered.append(report)
        return len(self.delivered) - 1


async def test_a_report_that_cannot_be_written_is_retried_not_fatal() -> None:
    engine = FakeSlotOwner()
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


class CatchingUpChannel(UnwritableChannel):
    """A control channel whose catch-up reads `newer`, a publication the member had not seen yet."""

    def __init__(self, publication: Publication, newer: Publication | None = None) -> None:
        super().__init__(publication, failures=0)
        self.newer = newer
        self.catch_ups = 0

    def catch_up(self, timeout_seconds: float = 10.0) -> None:
        self.catch_ups += 1
        if self.newer is not None:
            self.state = ControlState(self.newer)


async def run_until(member: RangeMember, condition: Callable[[], bool]) -> None:
    stop = asyncio.Event()
    running = asyncio.create_task(member.run(stop))

    async def reached() -> None:
        while not condition():
            assert not running.done(), f"the member ended: {running.exception()!r}"
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(reached(), 10)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)


async def lose_and_acquire_again(engine: FakeSlotOwner, channel: CatchingUpChannel, slot: int) -> None:
    """Apply epoch 3 (slots 0-2 of 6 for worker 0), then let the engine lose `slot` by itself (its
    producer fenced during a broker fault: released without committing), and wait until the
    member has acquired it again."""
    member = RangeMember(engine, channel, 0, heartbeat_seconds=0.01, poll_seconds=0.01)  # type: ignore[arg-type]
    await run_until(member, lambda: member.applied_epoch == 3)
    engine.held.discard(slot)
    await run_until(member, lambda: engine.held == {0, 1, 2})


async def test_a_slot_the_engine_lost_in_place_is_acquired_again_while_the_publication_still_gives_it() -> None:
    engine = FakeSlotOwner()
    channel = CatchingUpChannel(Publication(RangeMap.even(6, 2, epoch=3)))
    await lose_and_acquire_again(engine, channel, 1)
    assert engine.acquired == [{0, 1, 2}, {1}]
    assert channel.catch_ups >= 2  # decided on the caught-up publication, not a stale one
    assert channel.delivered[-1].held == {0, 1, 2}


async def test_a_lost_slot_a_newer_epoch_gives_away_is_not_acquired_again() -> None:
    engine = FakeSlotOwner()
    channel = CatchingUpChannel(Publication(RangeMap.even(6, 2, epoch=3)))
    member = RangeMember(engine, channel, 0, heartbeat_seconds=0.01, poll_seconds=0.01)  # type: ignore[arg-type]
    await run_until(member, lambda: member.applied_epoch == 3)
    # Fenced by its new owner: epoch 4 (three workers) gave slot 2 away, and the member has not read it.
    channel.newer = Publication(RangeMap.even(6, 3, epoch=4))
    engine.held.discard(2)
    await run_until(member, lambda: member.applied_epoch == 4)
    assert engine.acquired == [{0, 1, 2}]
    assert engine.held == {0, 1}


async def test_an_acquire_of_lost_slots_that_fails_is_tried_again() -> None:
    class FlakyEngine(FakeSlotOwner):
        failures = 1

        async def acquire(self, slots: Collection[int]) -> None:
            if self.acquired and self.failures:  # the first re-acquire: the broker is still restarting
                self.failures -= 1
                raise KafkaException(KafkaError(KafkaError._DESTROY_BROKER, "Failed to get offsets"))
            await super().acquire(slots)

    engine = FlakyEngine()
    await lose_and_acquire_again(engine, CatchingUpChannel(Publication(RangeMap.even(6, 2, epoch=3))), 0)
    assert engine.failures == 0 and engine.acquired == [{0, 1, 2}, {0}]


async def test_a_catch_up_that_fails_before_acquiring_lost_slots_is_tried_again() -> None:
    """Seen in the frozen-broker fault test: the catch-up before the re-acquire read the control
    topic's end while the frozen node's handle was being decommissioned, and its _DESTROY_BROKER
    ended the worker."""

    class FlakyCatchUp(CatchingUpChannel):
        catch_up_failures = 1

        def catch_up(self, timeout_seconds: float = 10.0) -> None:
            # The third: after those that start each run of the member below, the re-acquire's.
            if self.catch_ups == 2 and self.catch_up_failures:
                self.catch_up_failures -= 1
                raise KafkaException(KafkaError(KafkaError._DESTROY_BROKER, "Failed to get watermark offsets"))
            super().catch_up(timeout_seconds)

    engine = FakeSlotOwner()
    channel = FlakyCatchUp(Publication(RangeMap.even(6, 2, epoch=3)))
    await lose_and_acquire_again(engine, channel, 0)
    assert channel.catch_up_failures == 0 and engine.acquired == [{0, 1, 2}, {0}]


def test_reports_are_described_with_their_age_so_a_silent_worker_stands_out() -> None:
    reports = {1: WorkerReport(1, 5, frozenset(range(6, 12)), at_ms=10_000),
               0: WorkerReport(0, 6, frozenset({0, 1, 2}), at_ms=69_600)}
    assert describe_reports(reports) == "w0@6[0-2] w1@5[6-11]"
    assert describe_reports(reports, at_ms=70_000) == "w0@6[0-2] 0.4s ago w1@5[6-11] 60.0s ago"


async def test_a_final_report_that_cannot_be_written_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeSlotOwner()
    channel = UnwritableChannel(Publication(RangeMap.even(6, 2, epoch=3)), failures=1)
    member = RangeMember(engine, channel, 0)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="keyrange.ranges.member"):
        await member.report_final()
    assert channel.delivered == []
    (record,) = [r for r in caplog.records if "final report" in r.getMessage()]
    assert "ControlWriteFailed: control record to g.control not delivered within 10 s" in record.getMessage()
    await member.report_final()  # written when the channel works
    assert [r.held for r in channel.delivered] == [frozenset()]


class RecordingChannel(UnwritableChannel):
    """A writable control channel that also records, in `steps`, each report and each acquire."""

    def __init__(self, publication: Publication, steps: list[str]) -> None:
        super().__init__(publication, failures=0)
        self.steps = steps

    def report(self, report: WorkerReport) -> int:
        self.steps.append(f"report {report.epoch} holding {sorted(report.held)}")
        return super().report(report)


class RecordingOwner(FakeSlotOwner):
    """A FakeSlotOwner that writes its acquires and releases into the shared `steps`."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__()
        self.steps = steps

    async def acquire(self, slots: Collection[int]) -> None:
        self.steps.append(f"acquire {sorted(slots)}")
        await super().acquire(slots)

    async def release(self, slots: Collection[int]) -> None:
        self.steps.append(f"release {sorted(slots)}")
        await super().release(slots)


async def test_a_granted_new_owner_acquires_before_it_writes_a_report() -> None:
    # Nobody waits for a report of the grant's epoch before the acquire (the controller awaits only
    # the old owners of a transit); a write before the acquire is a broker round trip inside the pause.
    steps: list[str] = []
    engine = RecordingOwner(steps)
    engine.held = {0, 1, 2}
    channel = RecordingChannel(Publication(RangeMap.even(6, 1, epoch=5)), steps)
    member = RangeMember(engine, channel, 0, heartbeat_seconds=60, poll_seconds=0.01)  # type: ignore[arg-type]
    member.applied_epoch, member.claim = 4, 7  # running, its worker id claimed by its first report
    await run_until(member, lambda: member.applied_epoch == 5)
    assert steps == ["acquire [3, 4, 5]", "report 5 holding [0, 1, 2, 3, 4, 5]"]


async def test_a_process_that_has_not_claimed_its_worker_id_reports_before_it_acquires() -> None:
    # Its first report claims the worker id (one owner per identity): a second process, or a restart,
    # that acquired first would fence the process it replaces before that one could stand down, and
    # the two would fence each other's producers in turn.
    steps: list[str] = []
    engine = RecordingOwner(steps)
    channel = RecordingChannel(Publication(RangeMap.even(6, 1, epoch=5)), steps)
    member = RangeMember(engine, channel, 0, heartbeat_seconds=60, poll_seconds=0.01)  # type: ignore[arg-type]
    await run_until(member, lambda: member.applied_epoch == 5)
    assert steps[:2] == ["report 5 holding []", "acquire [0, 1, 2, 3, 4, 5]"]


async def test_an_awaited_worker_that_holds_nothing_reports_before_it_acquires() -> None:
    # Restarted in transit: its report without the moved slots completes the handoff, so it must not
    # wait for the restore of the slots it keeps.
    steps: list[str] = []
    engine = RecordingOwner(steps)
    transit = Publication(RangeMap.even(6, 2, epoch=5), frozenset({3, 4, 5}), frozenset({0}))
    channel = RecordingChannel(transit, steps)
    member = RangeMember(engine, channel, 0, heartbeat_seconds=60, poll_seconds=0.01)  # type: ignore[arg-type]
    await run_until(member, lambda: member.applied_epoch == 5)
    assert steps[:2] == ["report 5 holding []", "acquire [0, 1, 2]"]


class WakingChannel(RecordingChannel):
    """A control channel whose first wait on the topic (a poll with a timeout) reads `newer`; every
    read is written into `steps` (a zero-timeout read as `read`, a wait as `wait`)."""

    def __init__(self, publication: Publication, newer: Publication, steps: list[str]) -> None:
        super().__init__(publication, steps)
        self.newer: Publication | None = newer

    def poll(self, timeout_seconds: float = 0.0) -> int:
        self.steps.append("wait" if timeout_seconds > 0 else "read")
        if timeout_seconds > 0 and self.newer is not None:
            self.state.publication, self.newer = self.newer, None
            return 1
        return 0


async def test_an_epoch_read_by_the_wait_is_applied_without_reading_the_topic_again() -> None:
    # Each read is a hop to a thread and back through the worker's event loop, which a starved
    # worker (a CPU hog beside it) turns around only after the events queued before it: the wait
    # that read the transit has the newest state, so the release starts from it.
    steps: list[str] = []
    engine = RecordingOwner(steps)
    engine.held = {0, 1, 2, 3, 4, 5}
    transit = Publication(RangeMap.even(6, 2, epoch=6), frozenset({3, 4, 5}), frozenset({0}))
    channel = WakingChannel(Publication(RangeMap.even(6, 1, epoch=5)), transit, steps)
    member = RangeMember(engine, channel, 0, heartbeat_seconds=60, poll_seconds=0.01)  # type: ignore[arg-type]
    member.applied_epoch, member.claim = 5, 7
    await run_until(member, lambda: member.applied_epoch == 6)
    released = steps.index("release [3, 4, 5]")
    assert steps[released - 1] == "wait", steps


async def test_a_report_says_which_prepare_the_worker_read_and_how_far_it_read_the_topic() -> None:
    # A handoff that waits out its read-ahead then says whether the new owner ever read the prepare.
    channel = UnwritableChannel(Publication(RangeMap.even(6, 2, epoch=3)), failures=0)
    channel.state.apply(PREPARE_KEY, Prepare(2, {0: frozenset({2})}, 0).encode(), 56)
    member = RangeMember(FakeSlotOwner(), channel, 0, heartbeat_seconds=0.01, poll_seconds=0.01)  # type: ignore[arg-type]
    await run_until(member, lambda: member.applied_epoch == 3 and bool(channel.delivered))
    assert (channel.delivered[-1].prepare_epoch, channel.delivered[-1].read_to) == (2, 57)


def test_a_report_s_reading_round_trips_and_an_older_report_reads_as_unsaid() -> None:
    report = WorkerReport(1, 4, frozenset({3}), 1_000, prepare_epoch=3, read_to=812)
    assert WorkerReport.decode(report.encode()) == report
    older = WorkerReport(1, 4, frozenset({3}), 1_000).encode()
    assert b"readTo" not in older and b"prepareEpoch" not in older
    assert (WorkerReport.decode(older).prepare_epoch, WorkerReport.decode(older).read_to) == (0, -1)


def test_the_control_state_knows_how_far_it_read_even_past_records_it_cannot_parse() -> None:
    state = ControlState()
    state.apply(b"worker.1", b"not json", 9)
    state.apply(None, None, 10)  # a tombstone
    assert state.read_to == 11
    state.apply(b"worker.1", WorkerReport(1, 1, frozenset(), 0).encode(), 4)  # never goes back
    assert state.read_to == 11
