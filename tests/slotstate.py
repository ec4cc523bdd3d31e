"""A slot's bookkeeping as a worker holds it, for unit tests without Kafka."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

from keyrange.events import totals_key
from keyrange.ranges.layout import SlotLayout
from keyrange.worker.restore import RestoredPartition
from keyrange.worker.slot import SlotMetrics, SlotState
from keyrange.worker.transactions import OutputRecord, SlotTransactions

STATE_TOPIC = "g.state"


def held_slot(slot: int = 0, transactions: Any = None, restored: RestoredPartition | None = None) -> SlotState:
    """A held slot from offset 0, reading the partition of the same number (staging outputs never
    uses its producer, so by default it has none)."""
    return SlotState(slot, slot, restored or RestoredPartition(0), 10.0, time.time, SlotMetrics("c", "w0", slot),
                     cast(SlotTransactions, transactions), slot)


def held_hash_range(layout: SlotLayout, slot: int, start_offset: int = 0) -> SlotState:
    """A held slot of `layout` from `start_offset`: a hash range of its partition when the layout
    cuts partitions (no producer, as `held_slot`)."""
    partition, parts = layout.partition_of(slot), layout.per_partition
    return SlotState(slot, partition, RestoredPartition(start_offset), 10.0, time.time,
                     SlotMetrics("c", "w0", layout.describe_slot(slot)), cast(SlotTransactions, None), partition,
                     totals_key(slot % parts, parts), parts)


@dataclass
class Staged:
    """What a slot's next transaction carries, changelog records apart."""

    outputs: list[OutputRecord]
    changelog: list[OutputRecord]
    processed: int
    dead_letters: list[str]
    committable: int


def take_staged(slot: SlotState) -> Staged | None:
    """Take the slot's next commit batch (as the committer does), None when it has nothing."""
    batch = slot.take_batch("events", STATE_TOPIC)
    if batch is None:
        return None
    return Staged([r for r in batch.records if r.topic != STATE_TOPIC],
                  [r for r in batch.records if r.topic == STATE_TOPIC], batch.processed, batch.dead_letters,
                  batch.committable)
