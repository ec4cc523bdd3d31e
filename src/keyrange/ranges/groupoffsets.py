"""The consumer group's committed offset per partition when partitions are cut into hash ranges.

Users' tools (kafka-consumer-groups, KEDA's Kafka scaler, Burrow) read a consumer's progress from
its group's committed offset per partition. A whole-partition slot commits it in its own
transactions. Hash-range slots of one partition are at different offsets, and their positions are
their totals records (worker/positions.py), so none of them commits the group's offset; the
controller commits, for each partition, the lowest position its slots reported (`lowest_positions`):
everything below it is finished, so the lag those tools show is never too low (it counts records
the faster slots already finished). Committed only forward, outside any transaction: it is what
tools read, never where a slot resumes from unless the slot has no totals record yet.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from keyrange.kafkaclients import KafkaClients
from keyrange.ranges.channel import WorkerReport
from keyrange.ranges.layout import SlotLayout

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_SECONDS = 10.0


def lowest_positions(layout: SlotLayout, known: dict[int, int], reports: Mapping[int, WorkerReport]) -> dict[int, int]:
    """Fold the positions in `reports` into `known` (slot -> the highest position seen: positions only
    move forward, and a report may be older than one read before), and return per partition the
    lowest position of its slots, for the partitions all of whose slots have one."""
    for report in reports.values():
        for slot, offset in report.positions.items():
            if 0 <= slot < layout.slot_count and offset > known.get(slot, -1):
                known[slot] = offset
    out = {}
    for p in range(layout.partitions):
        slots = layout.slots_of_partition(p)
        if all(s in known for s in slots):
            out[p] = min(known[s] for s in slots)
    return out


class GroupOffsetWriter:
    """Commits offsets of the input topic to the consumer group, forward only (outside transactions)."""

    def __init__(self, bootstrap: str, group_id: str, topic: str,
                 client_properties: Mapping[str, str] | None = None) -> None:
        config = KafkaClients(bootstrap, dict(client_properties or {})).consumer(group_id)
        self._consumer = Consumer(config)
        self._topic = topic
        self._committed: dict[int, int] = {}

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit the offsets (partition -> offset) that are past what this writer committed; a
        failure is logged and tried again with the next call."""
        forward = {p: o for p, o in offsets.items() if o > self._committed.get(p, -1)}
        if not forward:
            return
        try:
            self._consumer.commit(offsets=[TopicPartition(self._topic, p, o) for p, o in sorted(forward.items())],
                                  asynchronous=False)
        except KafkaException as exc:
            log.warning("committing the group's offsets %s of %s failed (%s); trying again later", forward,
                        self._topic, exc)
            return
        self._committed.update(forward)

    def close(self) -> None:
        """Close the consumer (it never joined the group)."""
        self._consumer.close()
