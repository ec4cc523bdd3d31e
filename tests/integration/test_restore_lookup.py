"""An acquire's restore looks its slots' committed offsets up without waiting for offsets that are
pending in a transaction: once the acquire initialised the slots' producers, every earlier
transaction of their transactional ids is decided, so offsets still pending are a fenced producer's
late write. A stable lookup (what a read_committed consumer asks) waits for such offsets to be
decided, which nobody does until the new owner commits: the acquire failed on a timeout, again and
again (test_worker_outage's slot given up during an outage: its abandoned producer's offsets reached
the group coordinator after its successor's init_transactions).

That late write cannot be produced on demand (librdkafka decides when a stuck request goes out), so
a stand-in holds offsets of the partition pending here: a transaction of another transactional id,
left open while the restore runs.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker.restorer import Restorer
from keyrange.worker.snapshots import CHANGELOG_TOPIC_CONFIG
from tests.integration.worker_helpers import settings_for

TIMEOUT_SECONDS = 8.0
"""The settings' Kafka timeout: a stable lookup gives up after it."""
COMMITTED = 3
PENDING = 5


def test_the_restore_does_not_wait_for_offsets_pending_in_a_transaction(any_bootstrap: str,
                                                                       topic_name: str) -> None:
    settings = dataclasses.replace(settings_for(any_bootstrap, topic_name), kafka_timeout_seconds=TIMEOUT_SECONDS)
    outputs = [TopicSpec(settings.sink, 1), TopicSpec(settings.dlq, 1),
               TopicSpec(settings.state, 1, dict(CHANGELOG_TOPIC_CONFIG), exact_partitions=True)]
    ensure_topics(any_bootstrap, [TopicSpec(topic_name, 1), *outputs])
    plain = Producer({"bootstrap.servers": any_bootstrap})
    for i in range(PENDING + 1):
        plain.produce(topic_name, key=str(i), value=b"{}", partition=0)
    assert plain.flush(30) == 0
    group = Consumer({"bootstrap.servers": any_bootstrap, "group.id": settings.group_id,
                      "enable.auto.commit": False})
    holder = Producer({"bootstrap.servers": any_bootstrap, "transactional.id": f"stand-in-{uuid.uuid4()}"})
    restorer = Restorer(settings, {topic_name: 1, settings.sink: 1, settings.dlq: 1, settings.state: 1})
    try:
        group.commit(offsets=[TopicPartition(topic_name, 0, COMMITTED)], asynchronous=False)
        holder.init_transactions(30)
        holder.begin_transaction()
        holder.send_offsets_to_transaction([TopicPartition(topic_name, 0, PENDING)], group.consumer_group_metadata(),
                                           30)
        began = time.monotonic()
        restored = restorer.restore_slots([0])
        took = time.monotonic() - began
        assert restored[0].start_offset == COMMITTED
        assert took < TIMEOUT_SECONDS, f"the restore took {took:.1f} s: it waited for the pending offsets"
    finally:
        restorer.close()
        holder.abort_transaction(30)
        group.close()
