"""Looking up where a log begins and ends (the restore's changelog search) rides out a broker that
leaves the cluster: librdkafka fails a request in flight to it (_DESTROY_BROKER, a transport error,
a timeout) and the next one goes to the partition's new leader. Only a topic that does not exist is
the user's to fix."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from keyrange.worker.logreader import LogReader, RestoreError
from keyrange.worker.settings import WorkerSettings

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0",
                          kafka_timeout_seconds=2.0)


class Topics:
    def __init__(self, names: list[str]) -> None:
        self.topics = dict.fromkeys(names)


class FlakyConsumer:
    """get_watermark_offsets fails with `errors` in turn, then answers (0, 10)."""

    def __init__(self, errors: list[int], topics: list[str]) -> None:
        self.errors = list(errors)
        self.calls = 0
        self._topics = topics

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None, **_: Any) -> tuple[int, int]:
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 0, 10

    def list_topics(self, topic: str | None = None, timeout: float | None = None) -> Topics:
        return Topics(self._topics)


@pytest.mark.parametrize("code", [KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                                  KafkaError.NOT_LEADER_FOR_PARTITION])
def test_a_broker_leaving_mid_lookup_is_tried_again(code: int) -> None:
    consumer = FlakyConsumer([code, code], ["g.state"])
    reader = LogReader(SETTINGS, consumer=consumer)  # type: ignore[arg-type]
    assert reader.bounds([("g.state", 5)]) == {("g.state", 5): (0, 10)}
    assert consumer.calls == 3


def test_a_missing_topic_is_said_at_once() -> None:
    consumer = FlakyConsumer([KafkaError._UNKNOWN_PARTITION] * 100, ["events"])
    reader = LogReader(SETTINGS, consumer=consumer)  # type: ignore[arg-type]
    with pytest.raises(RestoreError, match=r"the broker has no topic g\.state"):
        reader.bounds([("g.state", 5)])
    assert consumer.calls == 1


def test_a_lookup_that_keeps_failing_gives_up_at_the_kafka_timeout() -> None:
    consumer = FlakyConsumer([KafkaError._TRANSPORT] * 1000, ["g.state"])
    reader = LogReader(SETTINGS, consumer=consumer)  # type: ignore[arg-type]
    with pytest.raises(RestoreError, match="cannot look up where"):
        reader.bounds([("g.state", 5)])
    assert consumer.calls > 1
