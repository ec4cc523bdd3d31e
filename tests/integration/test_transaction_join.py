"""A release's batch joined to its slot's transaction in flight, on a real broker: one commit
carries both batches' outputs, and the group's committed offset is the joined batch's (newer) one.

Joined before the transaction writes its position, both go out in one send_offsets; joined after
it, the transaction sends its offsets a second time, which each broker must take as the newer."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker.transactions import OutputRecord, SlotTransactions
from tests.conftest import BrokerUnderTest
from tests.integration.worker_helpers import settings_for
from tests.kafkatools import committed_offsets, read_topic


class JoinedAt:
    """A slot's real producer that, at its first `call`, has `join` called (as a release on the
    event loop does while the producer's thread is in that call)."""

    def __init__(self, producer: Producer, call: str) -> None:
        self._producer = producer
        self._call = call
        self.join: Any = None
        self.joined: bool | None = None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._producer, name)
        if name != self._call:
            return method

        def joined_first(*args: Any) -> Any:
            if self.joined is None:
                self.joined = self.join()
            return method(*args)

        return joined_first


@pytest.mark.parametrize("call", ["begin_transaction", "flush"])
async def test_what_joined_a_transaction_in_flight_commits_with_it(broker_engine: BrokerUnderTest, topic_name: str,
                                                                   call: str) -> None:
    bootstrap = broker_engine.bootstrap
    s = settings_for(bootstrap, topic_name)
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1), TopicSpec(s.sink, 1)], s.kafka_timeout_seconds)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": s.group_id, "log_level": 3})
    made: list[JoinedAt] = []

    def make_producer(config: dict[str, Any]) -> Producer:
        made.append(JoinedAt(Producer(config), call))
        return made[0]  # type: ignore[return-value]

    output = SlotTransactions(s, 0, consumer.consumer_group_metadata(), make_producer=make_producer)
    try:
        await output.open()
        made[0].join = lambda: output.join([OutputRecord(s.sink, 0, b"2", b"{}")], [TopicPartition(topic_name, 0, 12)])
        await output.commit([OutputRecord(s.sink, 0, b"1", b"{}")], [TopicPartition(topic_name, 0, 10)])
        assert made[0].joined
        assert committed_offsets(bootstrap, topic_name, s.group_id) == {0: 12}
        assert [m.key() for m in read_topic(bootstrap, s.sink, expect=2)] == [b"1", b"2"]
    finally:
        await output.close()
        consumer.close()
