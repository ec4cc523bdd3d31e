"""One process per worker id: two processes that both run worker 0 (a force-deleted pod still
running beside its replacement, a second `keyrange worker --worker-id 0`) would fence each other's
slot producers forever, both running handler calls. The older one stands down, with an error that
says so, and never reports again (member.py); claims are ordered by control-topic offsets, not
clocks."""

from __future__ import annotations

import asyncio

import pytest

from keyrange.ranges.channel import ControlState, Publication, WorkerReport
from keyrange.ranges.member import IdentityTaken, RangeMember
from keyrange.ranges.rangemap import RangeMap
from tests.slot_owner import FakeSlotOwner


class Topic:
    """The control topic's one partition: (key, value) records at their offsets."""

    def __init__(self, publication: Publication) -> None:
        self.records: list[tuple[bytes, bytes]] = [(b"assignment", publication.encode())]


class Channel:
    """One process's view of the shared topic: writes append, polls fold what is new in order."""

    group_id = "g"

    def __init__(self, topic: Topic) -> None:
        self.topic = topic
        self.state = ControlState()
        self.read = 0

    def poll(self, timeout_seconds: float = 0.0) -> int:
        new = self.topic.records[self.read:]
        for offset, (key, value) in enumerate(new, start=self.read):
            self.state.apply(key, value, offset)
        self.read += len(new)
        return len(new)

    def catch_up(self, timeout_seconds: float = 10.0) -> None:
        self.poll()

    def report(self, report: WorkerReport) -> int:
        self.topic.records.append((f"worker.{report.worker}".encode(), report.encode()))
        return len(self.topic.records) - 1

    def reports_of(self, instance: str) -> int:
        return sum(1 for key, value in self.topic.records
                   if key.startswith(b"worker.") and WorkerReport.decode(value).instance == instance)


def _member(topic: Topic) -> RangeMember:
    return RangeMember(FakeSlotOwner(), Channel(topic), 0, heartbeat_seconds=0.0)  # type: ignore[arg-type]


async def test_the_older_of_two_processes_with_one_worker_id_stands_down_and_stays_silent() -> None:
    topic = Topic(Publication(RangeMap.even(4, 1, epoch=1)))
    old, new = _member(topic), _member(topic)
    await old.sync_once()
    assert old.claim >= 0 and old.engine.held_slots == {0, 1, 2, 3}
    await new.sync_once()  # a newer process starts as worker 0: it claims the id after the old one
    assert new.claim > old.claim
    with pytest.raises(IdentityTaken, match="worker 0 of group 'g' was claimed by another process"):
        await old.sync_once()
    written = old.channel.reports_of(old.instance)  # type: ignore[attr-defined]
    await old.report(1)  # e.g. the final report after its engine stopped
    assert old.channel.reports_of(old.instance) == written  # type: ignore[attr-defined]
    for _ in range(3):  # the old one's earlier heartbeats do not make the newer one stand down
        await new.sync_once()
    assert new.engine.held_slots == {0, 1, 2, 3} and not new.stood_down


async def test_a_lost_slot_is_not_acquired_again_when_a_newer_process_took_the_id() -> None:
    topic = Topic(Publication(RangeMap.even(2, 1, epoch=1)))
    old, new = _member(topic), _member(topic)
    await old.sync_once()
    await new.sync_once()
    old.engine.held.clear()  # the newer process's acquire fenced the old one's producers
    with pytest.raises(IdentityTaken):
        await old._acquire_lost(1)
    assert old.engine.held_slots == set()


def test_claims_are_ordered_by_offset_and_reports_without_an_instance_claim_nothing() -> None:
    state = ControlState()
    first = WorkerReport(0, 1, frozenset(), 0, pid=10, instance="a")
    state.apply(b"worker.0", first.encode(), 5)
    assert state.claims[0].claim == 5 and state.claims[0].instance == "a"
    state.apply(b"worker.0", WorkerReport(0, 1, frozenset(), 0, pid=11, instance="b").encode(), 9)
    state.apply(b"worker.0", WorkerReport(0, 1, frozenset(), 0, pid=10, instance="a", claim=5).encode(), 12)
    assert state.claims[0].instance == "b" and state.claims[0].claim == 9 and state.claims[0].pid == 11
    state.apply(b"worker.1", WorkerReport(1, 1, frozenset(), 0).encode(), 13)  # an older writer
    assert 1 not in state.claims
    assert WorkerReport.decode(first.encode()) == first


async def test_a_worker_restarted_in_place_is_a_newer_claim_and_runs() -> None:
    topic = Topic(Publication(RangeMap.even(2, 1, epoch=1)))
    crashed = _member(topic)
    await crashed.sync_once()
    restarted = _member(topic)  # same worker id, new process; the crashed one is gone
    await asyncio.gather(*(restarted.sync_once() for _ in range(3)))
    assert restarted.engine.held_slots == {0, 1} and not restarted.stood_down
