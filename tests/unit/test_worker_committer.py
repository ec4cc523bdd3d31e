"""The committer: which slots a commit carries (no Kafka: each slot's transactions are recorded)."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import TopicPartition

from keyrange.worker.committer import Committer
from keyrange.worker.partition import PartitionMetrics, PartitionState
from keyrange.worker.rebuild import RestoredPartition
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0")


class RecordingTransactions:
    """Stands in for a slot's SlotTransactions: records what each commit carried."""

    def __init__(self) -> None:
        self.commits: list[list[OutputRecord]] = []

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition]) -> None:
        self.commits.append(records)


def slot_with_a_state_change(slot: int) -> tuple[PartitionState, RecordingTransactions]:
    transactions = RecordingTransactions()
    ps = PartitionState(slot, RestoredPartition(0), 10.0, time.time, PartitionMetrics("c", "w0", slot),
                        transactions)  # type: ignore[arg-type]
    ps.dirty_state[1000 + slot] = (b"1", 0)
    return ps, transactions


def test_a_release_commits_only_the_released_slots_and_the_others_commit_on_their_interval() -> None:
    """A release waits for its commit: the slots it keeps must not add their transactions to it."""
    (kept, kept_txn), (released, released_txn) = slot_with_a_state_change(0), slot_with_a_state_change(1)
    committer = Committer(SETTINGS, lambda: [kept, released], WorkerStats())

    asyncio.run(committer.commit_now(only={1}))
    assert len(released_txn.commits) == 1 and kept_txn.commits == []
    assert kept.dirty_state  # still staged, not lost

    asyncio.run(committer.commit_now())
    assert len(kept_txn.commits) == 1 and len(released_txn.commits) == 1  # nothing new on slot 1
    assert [r.key for r in kept_txn.commits[0]] == [b"1000"]
