"""kafkaquirks: what a failed Kafka call means, the one backoff (with an injected clock), and the
tansu workarounds' rules (no Kafka)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyrange.kafkaquirks import (
    Backoff,
    Failure,
    classify,
    kafka_error,
    known_log_end,
    listed_topic_config,
    outputs_acknowledged_before_offsets,
    read_past_listed_end,
    slow_or_away,
    transaction_end_lock,
    transactions_end_one_at_a_time,
)
from tests.kafka_failures import system_error_from


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("error", "failure"), [
    # Kafka flags a fenced producer fatal; tansu flags the same codes only abortable.
    (KafkaError(KafkaError._FENCED, fatal=True), Failure.FENCED),
    (KafkaError(KafkaError._FENCED, txn_requires_abort=True), Failure.FENCED),
    (KafkaError(KafkaError.PRODUCER_FENCED, txn_requires_abort=True), Failure.FENCED),
    (KafkaError(KafkaError.PRODUCER_FENCED), Failure.FENCED),
    # An epoch that is gone for good is fencing; an abortable one is the broker aborting this
    # producer's own timed-out transaction (KIP-588), which an abort gets over.
    (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True), Failure.FENCED),
    (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, txn_requires_abort=True), Failure.ABORTABLE),
    (KafkaError(KafkaError._CONFLICT), Failure.CONFLICT),
    (KafkaError(KafkaError._CONFLICT, retriable=True), Failure.CONFLICT),
    (KafkaError(KafkaError._STATE, fatal=True), Failure.FATAL),
    (KafkaError(KafkaError._MSG_TIMED_OUT, txn_requires_abort=True), Failure.ABORTABLE),
    (KafkaError(KafkaError._TIMED_OUT, retriable=True, txn_requires_abort=True), Failure.ABORTABLE),
    (KafkaError(KafkaError._TIMED_OUT, retriable=True), Failure.RETRIABLE),
    (KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True), Failure.RETRIABLE),
    (KafkaError(KafkaError._STATE), Failure.OTHER),
])
def test_classify(error: KafkaError, failure: Failure) -> None:
    assert classify(error) is failure


@pytest.mark.parametrize(("error", "again"), [
    (KafkaError(KafkaError._TIMED_OUT), True),
    (KafkaError(KafkaError._TIMED_OUT, retriable=True), True),
    (KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True), True),
    (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), False),
    (KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), False),
    (KafkaError(KafkaError._FENCED, retriable=True), False),
])
def test_slow_or_away_is_a_timeout_or_a_retriable_error(error: KafkaError, again: bool) -> None:
    assert slow_or_away(error) is again


def test_kafka_error_unwraps_confluent_s_system_error() -> None:
    error = KafkaError(KafkaError._FENCED, fatal=True)
    assert kafka_error(KafkaException(error)) is error
    assert kafka_error(system_error_from(error)) is error


def test_a_system_error_of_anything_else_is_raised_again() -> None:
    bug = SystemError("a bug")
    with pytest.raises(SystemError, match="a bug"):
        kafka_error(bug)
    with pytest.raises(KafkaException):
        kafka_error(KafkaException("no KafkaError inside"))


def test_backoff_doubles_up_to_its_cap_and_a_success_starts_over() -> None:
    clock = Clock()
    backoff = Backoff(1.0, 4.0, clock)
    assert backoff.ready() and backoff.delay == 1.0
    waits = []
    for _ in range(4):
        delay = backoff.failed()
        start = clock.now
        while not backoff.ready():
            clock.now += 0.5
        waits.append((delay, clock.now - start))
    assert waits == [(1.0, 1.0), (2.0, 2.0), (4.0, 4.0), (4.0, 4.0)]
    assert backoff.failures == 4
    backoff.failed()
    assert not backoff.ready()
    backoff.succeeded()
    assert backoff.ready() and backoff.failures == 0 and backoff.failed() == 1.0


def test_backoff_defaults_and_a_long_outage_stay_at_the_cap() -> None:
    backoff = Backoff(clock=Clock())
    assert [backoff.failed() for _ in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    for _ in range(2000):  # no overflow however long Kafka stays away
        backoff.failed()
    assert backoff.delay == 30.0


def test_backoff_refuses_waits_that_are_not_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Backoff(0.0, 1.0)


def test_outputs_are_acknowledged_before_the_offsets_are_sent() -> None:
    calls: list[str] = []
    outputs_acknowledged_before_offsets(lambda: calls.append("flush"), lambda: calls.append("offsets"))
    assert calls == ["flush", "offsets"]
    calls.clear()

    def unacknowledged() -> None:
        raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, txn_requires_abort=True))

    with pytest.raises(KafkaException):
        outputs_acknowledged_before_offsets(unacknowledged, lambda: calls.append("offsets"))
    assert calls == []  # no offsets without their outputs


def test_the_known_end_is_the_larger_lower_bound() -> None:
    assert known_log_end(5000, 1) == 5000  # tansu's ListOffsets, too low after a batched produce
    assert known_log_end(10, 250) == 250  # fetch responses frozen while the partition is paused
    assert known_log_end(-1, -1) == -1


def test_a_read_reaches_past_the_listed_end_once() -> None:
    polls: list[float] = []
    read_past_listed_end(polls.append)
    assert polls == [0.1]


def test_an_unlisted_topic_config_is_none() -> None:
    configs = {"cleanup.policy": SimpleNamespace(value="compact,delete")}
    assert listed_topic_config(configs, "cleanup.policy") == "compact,delete"
    assert listed_topic_config(configs, "max.message.bytes") is None


def test_transactions_of_one_partition_end_one_at_a_time_on_a_host(tmp_path: Path) -> None:
    """tansu workaround: a transaction that ends while another of the same partition ends can stay
    counted open for good on tansu, so whoever ends one takes the partition's lock first; a holder
    that does not let go within the wait lets the next one go ahead unlocked (never a hang)."""
    lock = tmp_path / "locks" / "p0.lock"
    clock = Clock()

    def ticking() -> float:
        clock.now += 1.0
        return clock.now

    with (transactions_end_one_at_a_time(lock, 5.0) as first,
          transactions_end_one_at_a_time(lock, 5.0, clock=ticking) as second):
        assert (first, second) == (True, False)
    with transactions_end_one_at_a_time(lock, 5.0) as after:
        assert after
    with transactions_end_one_at_a_time(None, 5.0) as unlocked:
        assert not unlocked


def test_the_lock_is_per_cluster_topic_and_partition() -> None:
    locks = {transaction_end_lock(b, t, p) for b in ("a:9092", "b:9092") for t in ("x", "y") for p in (0, 1, None)}
    assert len(locks) == 12
    assert transaction_end_lock("a:9092", "x", 0) == transaction_end_lock("a:9092", "x", 0)
