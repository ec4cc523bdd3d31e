"""The lag's ListOffsets requests back off while they fail (no Kafka).

librdkafka 2.16 spins while an admin request waits for a broker it cannot reach: asked every
second, ListOffsets kept a worker at 93% of a core for as long as its broker was dead (measured:
2,776 of 3,000 CPU ticks in the 30 s after killing the tansu broker under a `keyrange worker`;
907 with this backoff). A partition whose leader could not be asked comes back as a *result*
with offset -1001, not as an error, so that counts as a failure too.
"""

from __future__ import annotations

from concurrent.futures import Future
from itertools import pairwise
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin._listoffsets import ListOffsetsResultInfo

from keyrange.kafkaquirks import Backoff
from keyrange.worker.consumer import LIST_OFFSETS_ABANDON_SECONDS, ListedEnds
from tests.unit.worker_fakes import FakeClock

UNREACHABLE = -1001


class AnsweringAdmin:
    """Stands in for the AdminClient: answers every ListOffsets at once with `offset`."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.asked = 0

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future[Any]]:
        self.asked += 1
        answers: dict[TopicPartition, Future[Any]] = {}
        for tp in request:
            future: Future[Any] = Future()
            future.set_result(ListOffsetsResultInfo(self.offset, -1, -1))
            answers[tp] = future
        return answers


def consumer_with(admin: AnsweringAdmin, clock: FakeClock) -> ListedEnds:
    """The log ends a worker's consumer asks `admin` for (ThreadedConsumer.high_watermarks)."""
    return ListedEnds("events", admin, Backoff(1.0, 60.0, clock))


def gauge_tick(consumer: ListedEnds) -> dict[int, int]:
    """What `high_watermarks` does with ListOffsets on every gauge tick."""
    return dict(consumer.tick([0, 1]))


def test_answered_requests_are_asked_again_at_every_tick() -> None:
    admin, clock = AnsweringAdmin(42), FakeClock()
    consumer = consumer_with(admin, clock)
    for _ in range(2):
        gauge_tick(consumer)
    assert gauge_tick(consumer) == {0: 42, 1: 42}
    assert admin.asked == 3


def test_unreachable_leaders_back_the_requests_off_doubling_to_a_minute() -> None:
    admin, clock = AnsweringAdmin(UNREACHABLE), FakeClock()
    consumer = consumer_with(admin, clock)
    ends = gauge_tick(consumer)
    asked_at = []
    for _ in range(400):  # 400 one-second ticks
        clock.now += 1.0
        before = admin.asked
        ends = gauge_tick(consumer)
        if admin.asked > before:
            asked_at.append(clock.now - 100.0)
    gaps = [b - a for a, b in pairwise(asked_at)]
    # Each answer is taken at the next tick, then the wait: 1, 2, 4, 8, 16, 32 s, then 60 s.
    assert gaps[:5] == [3.0, 5.0, 9.0, 17.0, 33.0]
    assert set(gaps[5:]) == {61.0}
    assert ends == {}, "an unreachable leader's -1001 is no end"


def test_one_answer_ends_the_backoff() -> None:
    admin, clock = AnsweringAdmin(UNREACHABLE), FakeClock()
    consumer = consumer_with(admin, clock)
    for _ in range(10):
        clock.now += 1.0
        gauge_tick(consumer)
    admin.offset = 7
    clock.now += 60.0
    gauge_tick(consumer)  # the -1001 answer taken, one more try after the wait
    clock.now += 1.0
    gauge_tick(consumer)  # this one was answered: asked again at once
    asked = admin.asked
    clock.now += 1.0
    assert gauge_tick(consumer) == {0: 7, 1: 7}
    assert admin.asked == asked + 1


class SilentAdmin(AnsweringAdmin):
    """Stands in for an AdminClient whose requests to a broker that went away are never answered."""

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future[Any]]:
        self.asked += 1
        return {tp: Future() for tp in request}


def test_a_request_never_answered_is_dropped_and_asked_again_so_the_ends_do_not_freeze() -> None:
    clock = FakeClock()
    silent = SilentAdmin(0)
    ends = ListedEnds("events", silent, Backoff(1.0, 60.0, clock), clock)
    gauge_tick(ends)
    for _ in range(int(LIST_OFFSETS_ABANDON_SECONDS)):
        clock.now += 1.0
        gauge_tick(ends)
    assert silent.asked == 1  # within the abandon time the request in flight is waited for
    clock.now += 1.0
    gauge_tick(ends)  # dropped as failed: the backoff's first wait runs from now
    clock.now += 1.0
    gauge_tick(ends)
    assert silent.asked == 2
