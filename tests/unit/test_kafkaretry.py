"""tests/kafkaretry.py: which failures of a test helper's read are tried again, and for how long."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyrange.kafkaio import KafkaUnreachable
from keyrange.worker.logreader import RestoreError
from tests.kafkaretry import is_transient, retrying
from tests.unit.worker_fakes import FakeClock


def timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets: Local: Timed out"))


def test_a_timeout_or_a_moving_coordinator_is_transient_a_missing_topic_is_not() -> None:
    assert is_transient(timed_out())
    assert is_transient(KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)))
    assert is_transient(KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)))
    assert is_transient(KafkaUnreachable("cannot reach Kafka at b:9092 within 10 s"))
    assert not is_transient(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    assert not is_transient(KeyError("events"))
    assert not is_transient(RestoreError("reading [('g.state', 0)] made no progress: the broker has no topic g.state"))


def test_a_read_that_timed_out_is_tried_again_until_it_answers() -> None:
    clock = FakeClock()
    answers: list[BaseException | int] = [timed_out(), timed_out(), 42]

    def read() -> int:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def sleep(seconds: float) -> None:
        clock.now += seconds

    assert retrying(read, seconds=60, clock=clock, sleep=sleep) == 42
    assert answers == []


def test_the_last_timeout_reaches_the_caller_after_the_deadline_and_other_errors_at_once() -> None:
    clock = FakeClock()
    calls: list[float] = []

    def read() -> int:
        calls.append(clock.now)
        clock.now += 10  # each try waits its own timeout
        raise timed_out()

    with pytest.raises(KafkaException, match="Timed out"):
        retrying(read, seconds=25, clock=clock, sleep=lambda s: None)
    assert calls == [100, 110, 120]

    def missing() -> int:
        calls.append(clock.now)
        raise KeyError("events")

    calls.clear()
    with pytest.raises(KeyError):
        retrying(missing, seconds=25, clock=clock, sleep=lambda s: None)
    assert len(calls) == 1
