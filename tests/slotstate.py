"""A slot's bookkeeping as a worker holds it, for unit tests without Kafka."""

from __future__ import annotations

import time
from typing import cast

from keyrange.worker.partition import PartitionMetrics, PartitionState
from keyrange.worker.restore import RestoredPartition
from keyrange.worker.transactions import SlotTransactions


def held_slot(partition: int = 0) -> PartitionState:
    """A held slot from offset 0 (staging outputs never uses its producer, so it has none)."""
    return PartitionState(partition, RestoredPartition(0), 10.0, time.time, PartitionMetrics("c", "w0", partition),
                          cast(SlotTransactions, None))
