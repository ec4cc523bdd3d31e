"""The range Controller carrying out the handoff (ranges/controller.py), over a control topic in memory.

The handoff's decisions are tested in test_handoff.py; these tests check that the controller does
what they say, in order, retries a write that failed, and reads the control topic only as it
comes back (it never folds its own writes into the channel's state).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from keyrange.ranges.channel import (
    ASSIGNMENT_KEY,
    PREPARE_KEY,
    WORKER_KEY_PREFIX,
    ControlState,
    ControlWriteFailed,
    Prepare,
    Publication,
    WorkerReport,
)
from keyrange.ranges.controller import Controller
from keyrange.ranges.handoff import Phase
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.planner import ScalingLimits, SlotLag
from keyrange.ranges.rangemap import RangeMap

T0 = 1_700_000_000_000
LIMITS = ScalingLimits(min_workers=1, max_workers=2, cooldown_seconds=0)


class MemoryChannel:
    """A control topic in memory: writes append records, `poll` folds in those not read yet."""

    topic = "payments.control"

    def __init__(self) -> None:
        self.state = ControlState()
        self.records: list[tuple[bytes, bytes]] = []
        self.failing: list[bytes] = []
        """Keys whose next write fails (as a write to a partition between leaders does)."""
        self._read = 0

    def claim_writer(self) -> None:
        pass

    def catch_up(self) -> None:
        self.poll()

    def poll(self, timeout_seconds: float = 0.0) -> int:
        new = self.records[self._read:]
        for key, value in new:
            self.state.apply(key, value)
        self._read = len(self.records)
        return len(new)

    def _write(self, key: bytes, value: bytes) -> None:
        if key in self.failing:
            self.failing.remove(key)
            raise ControlWriteFailed(f"control record {key!r} not written: timed out")
        self.records.append((key, value))

    def publish(self, publication: Publication) -> None:
        self._write(ASSIGNMENT_KEY, publication.encode())

    def announce(self, prepare: Prepare) -> None:
        self._write(PREPARE_KEY, prepare.encode())

    def report(self, report: WorkerReport) -> None:
        self._write(f"{WORKER_KEY_PREFIX}{report.worker}".encode(), report.encode())

    def close(self) -> None:
        pass

    def keys(self) -> list[bytes]:
        return [key for key, _ in self.records]


class Fleet:
    def __init__(self) -> None:
        self.workers = 0

    def scale_to(self, workers: int) -> None:
        self.workers = workers


class NoLag:
    def slot_lag(self) -> Mapping[int, SlotLag]:
        return {}


class WallClock:
    def __init__(self) -> None:
        self.now_ms = T0

    def __call__(self) -> int:
        return self.now_ms


def controller_on(channel: MemoryChannel, fleet: Fleet, clock: WallClock) -> Controller:
    controller = Controller(channel, 6, LIMITS, NoLag(), fleet, wall_clock_ms=clock)
    controller.start()
    return controller


def test_a_split_is_announced_published_and_granted_as_the_workers_report() -> None:
    channel, fleet, clock = MemoryChannel(), Fleet(), WallClock()
    controller = controller_on(channel, fleet, clock)
    assert channel.keys() == [ASSIGNMENT_KEY] and fleet.workers == 1
    assert controller.request_scale("up", "alert").applied
    assert channel.keys() == [ASSIGNMENT_KEY, PREPARE_KEY] and fleet.workers == 2
    assert channel.state.prepare is None, "the controller wrote its prepare into the channel's folded state"
    assert (controller.status().phase, controller.status().starting) == (Phase.STARTING, True)

    clock.now_ms += 400
    channel.report(WorkerReport(1, 1, frozenset(), clock.now_ms))
    controller.step()
    assert controller.status().phase is Phase.READING_AHEAD
    channel.report(WorkerReport(1, 1, frozenset(), clock.now_ms, warm=frozenset({3, 4, 5}), warm_epoch=1))
    controller.step()
    status = controller.status()
    assert (status.phase, status.epoch, status.handoff_awaiting, status.starting) == (
        Phase.IN_TRANSIT, 2, frozenset({0}), False)
    assert controller.publication.transit == {3, 4, 5}

    clock.now_ms += 100
    channel.report(WorkerReport(0, 2, frozenset({0, 1, 2}), clock.now_ms))
    assert controller.step().epoch == 3
    assert controller.status().phase is Phase.GRANTED and not controller.publication.transit
    assert channel.keys() == [ASSIGNMENT_KEY, PREPARE_KEY, b"worker.1", b"worker.1", ASSIGNMENT_KEY, b"worker.0",
                              ASSIGNMENT_KEY]
    (rescale,) = controller.rescales
    assert (rescale.action, rescale.epoch, rescale.workers_before, rescale.workers_after, rescale.requested) == (
        "split", 2, 1, 2, "alert")
    assert (rescale.decided_ms, rescale.published_ms, rescale.settled_ms) == (T0, T0 + 400, T0 + 500)


def test_a_prepare_whose_write_failed_is_written_again_and_the_new_worker_started() -> None:
    channel, fleet, clock = MemoryChannel(), Fleet(), WallClock()
    controller = controller_on(channel, fleet, clock)
    channel.failing.append(PREPARE_KEY)
    with pytest.raises(ControlWriteFailed):
        controller.request_scale("up", "alert")
    assert controller.request_scale("up", "again").detail.startswith("a rescale is in progress")
    controller.step()
    assert channel.keys() == [ASSIGNMENT_KEY, PREPARE_KEY]
    assert fleet.workers == 2


def test_a_publication_whose_write_failed_is_written_at_the_next_step() -> None:
    channel, fleet, clock = MemoryChannel(), Fleet(), WallClock()
    controller = controller_on(channel, fleet, clock)
    controller.warm_timeout_seconds = 0
    assert controller.request_scale("up", "alert").applied
    channel.report(WorkerReport(1, 1, frozenset(), clock.now_ms))
    channel.failing.append(ASSIGNMENT_KEY)
    with pytest.raises(ControlWriteFailed):
        controller.step()
    assert controller.status().phase is Phase.READING_AHEAD and controller.publication.epoch == 1
    assert controller.step().epoch == 2
    assert [r.epoch for r in controller.rescales] == [2]


def test_a_restarted_controller_resumes_the_transit_and_grants_on_the_release() -> None:
    channel, fleet, clock = MemoryChannel(), Fleet(), WallClock()
    transit = Publication(RangeMap.even(6, 2, epoch=2), frozenset({3, 4, 5}), frozenset({0}), "split", T0)
    channel.records += [(ASSIGNMENT_KEY, Publication(RangeMap.even(6, 1)).encode()), (ASSIGNMENT_KEY, transit.encode())]
    controller = controller_on(channel, fleet, clock)
    assert controller.status().phase is Phase.IN_TRANSIT and fleet.workers == 2
    assert controller.request_scale("up", "alert").detail.startswith("a rescale is in progress")
    channel.report(WorkerReport(0, 2, frozenset({0, 1, 2}), clock.now_ms))
    assert controller.step().epoch == 3
    assert controller.rescales == [] and fleet.workers == 2


def test_a_consumer_of_fewer_partitions_than_workers_names_its_hash_ranges() -> None:
    channel, fleet, clock = MemoryChannel(), Fleet(), WallClock()
    limits = ScalingLimits(min_workers=1, max_workers=4, cooldown_seconds=0)
    controller = Controller(channel, 1, limits, NoLag(), fleet, wall_clock_ms=clock)
    controller.start()
    assert controller.status().layout == SlotLayout(1, 4)
    assert controller.request_scale("up", "alert").detail == "split 0: scale-up requested"
    refused = controller.request_scale("up", "alert")
    assert not refused.applied and refused.detail == "a rescale is in progress (epoch 1: w0=0)"
    assert refused.in_progress  # the operator leaves the split's record in status (decisions.py)


class RecordingGroupOffsets:
    """A GroupOffsetSink that records each commit with how many assignments were written before it."""

    def __init__(self, channel: MemoryChannel) -> None:
        self.channel = channel
        self.commits: list[tuple[dict[int, int], int]] = []

    def commit(self, offsets: Mapping[int, int]) -> None:
        self.commits.append((dict(offsets), self.channel.keys().count(ASSIGNMENT_KEY)))

    def close(self) -> None:
        pass


def test_a_release_is_granted_before_the_group_offsets_are_committed() -> None:
    # The group's offsets commit is a broker round trip the step waits for: the moved slots pause
    # until the grant, so the step that reads the release publishes it first.
    channel, fleet, clock = MemoryChannel(), Fleet(), WallClock()
    offsets = RecordingGroupOffsets(channel)
    monotonic = [100.0]
    controller = Controller(channel, 1, LIMITS, NoLag(), fleet, clock=lambda: monotonic[0], wall_clock_ms=clock,
                            group_offsets=offsets)
    controller.start()
    controller.warm_timeout_seconds = 0
    assert controller.status().layout == SlotLayout(1, 2)
    assert controller.request_scale("up", "alert").applied
    channel.report(WorkerReport(1, 1, frozenset(), clock.now_ms))
    channel.report(WorkerReport(0, 1, frozenset({0, 1}), clock.now_ms, positions={0: 10, 1: 12}))
    controller.step()
    assert controller.status().phase is Phase.IN_TRANSIT

    monotonic[0] += 1.0
    channel.report(WorkerReport(0, 2, frozenset({0}), clock.now_ms, positions={0: 11}))
    assert controller.step().epoch == 3
    assert offsets.commits[-1] == ({0: 11}, 3), offsets.commits
