"""Unassigning a partition twice (no Kafka: librdkafka assigns and unassigns locally).

Two sibling hash-range slots of one partition whose producers fail in the same commit round (both
fenced, or both given up after a broker fault or a freeze) are each released by a task of their own,
and each finds every slot of the partition revoked: both unassign the partition. librdkafka refuses
the second ("Can't subtract from empty assignment"), which failed the whole worker."""

from __future__ import annotations

import asyncio

from keyrange.worker.consumer import ThreadedConsumer
from keyrange.worker.settings import WorkerSettings

UNREACHABLE = "127.0.0.1:1"


def test_a_partition_unassigned_twice_is_unassigned_once() -> None:
    async def scenario() -> None:
        consumer = ThreadedConsumer(WorkerSettings(bootstrap=UNREACHABLE, topic="t", group_id="g",
                                                   kafka_timeout_seconds=0.2))
        await consumer.open()
        try:
            await consumer.assign({0: 5, 1: 7})
            await asyncio.gather(consumer.unassign([0]), consumer.unassign([0]))
            await consumer.unassign([1])
            await consumer.unassign([1])  # nothing is assigned any more
            await consumer.unassign([3])  # never assigned
        finally:
            await consumer.close()

    asyncio.run(scenario())
