"""A read-ahead while the old owner's transaction is open: the new owner reads ahead while the slots
still flow at their old owner, whose transactions carry the slots' offsets and are open almost all
the time on a busy machine. The read-ahead must plan from the offsets committed so far, not wait for
a moment when no transaction of the slots is open (a lookup of stable offsets waits for that: on
Apache Kafka it took 5-20 s with a CPU hog, and the handoff waited out its read-ahead timeout).

The lookup reads the group's offsets read_uncommitted, so the same test holds it to the offsets
committed so far once that transaction ended without committing: aborted, or left open by a frozen
owner whose slot is taken over (fenced: Kafka aborts it, tansu commits it torn). Neither broker
returns offsets of such a transaction that the committed ones do not include.
"""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.worker.restorer import Restorer
from tests.integration.worker_helpers import run_worker_until, settings_for
from tests.kafkatools import offsets_committed_so_far

PARTITIONS = 2


@pytest.mark.parametrize("ending", ["open", "aborted", "fenced"])
async def test_read_ahead_does_not_wait_for_the_old_owners_open_transaction(any_bootstrap: str, topic_name: str,
                                                                            ending: str) -> None:
    # A short Kafka timeout: a lookup that waits for the open transaction fails within it.
    settings = settings_for(any_bootstrap, topic_name, kafka_timeout_seconds=5.0)
    ensure_topics(any_bootstrap, [TopicSpec(topic_name, PARTITIONS)])
    events = list(generate(LoadShape(clients=20, duplicate_ratio=0.0, seed=5), count=400))
    produce_all(any_bootstrap, topic_name, events)

    def committed() -> dict[int, int]:
        return offsets_committed_so_far(any_bootstrap, topic_name, settings.group_id, range(PARTITIONS))

    worker = await run_worker_until(settings, "noop", list(range(PARTITIONS)),
                                    lambda _w: all(o > 0 for o in committed().values()))
    before = committed()
    # The old owner's next transaction, not yet committed: the slots' offsets (without outputs,
    # whose read would wait for it, as it does in a handoff for the transaction open at its start).
    group = Consumer(settings.clients.consumer(settings.group_id))
    owner = Producer(settings.clients.transactional_producer(f"{topic_name}-old-owner", 60_000))
    restorer = Restorer(settings, dict(worker.partition_counts))
    try:
        owner.init_transactions(30)
        owner.begin_transaction()
        owner.send_offsets_to_transaction([TopicPartition(topic_name, p, before[p] + 5) for p in range(PARTITIONS)],
                                          group.consumer_group_metadata(), 30)
        if ending == "aborted":
            owner.abort_transaction(30)
        elif ending == "fenced":
            # The slot's next owner initialises its transactional id: the frozen owner's transaction ends.
            Producer(settings.clients.transactional_producer(f"{topic_name}-old-owner", 60_000)).init_transactions(30)
        prefetched = await asyncio.to_thread(restorer.prefetch, range(PARTITIONS))
        # Once the transaction ended, a stable lookup (read_committed, as the acquire's) answers at once.
        expected = before if ending == "open" else stable_committed(group, topic_name)
        assert prefetched.committed == expected, "the read-ahead planned from offsets that were not committed"
        if ending == "aborted":
            assert expected == before
    finally:
        if ending == "open":
            owner.abort_transaction(30)
        restorer.close()
        group.close()


def stable_committed(group: Consumer, topic: str) -> dict[int, int]:
    """The group's committed offsets as a read_committed consumer looks them up (stable offsets)."""
    return {tp.partition: tp.offset for tp in group.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                                              timeout=30)}
