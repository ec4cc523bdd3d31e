"""Where a partition's log ends, for a read to the end: one rule for every such read.

The end is the high watermark of the broker's fetch responses, which librdkafka keeps per
assigned partition (`get_watermark_offsets(cached=True)`); -1 until a response came, which means
"not known yet", never "empty". Not a ListOffsets answer, which tansu gives too low right after a
batched produce (docs/kafka.md) and which on Kafka would add a round trip and nothing else, as a
read to the end fetches anyway. A read has reached the end when its position has: the position,
not the offset after the last record, because under read_committed the position moves past
transaction markers, which no record shows, and stops at the last stable offset while a
transaction is open (such a read waits until the transaction is decided). librdkafka keeps a
partition's last high watermark after it is unassigned, so a consumer must not read the same
partition to its end twice.

The reads that follow this rule: the worker's restores (worker/logreader.py, which takes the first
end a read is told rather than the newest, see `LogReader.read`), the demo's report
(local/demo.py) and the tests' `read_topic`. The aggregation's end probe
(aggregation/partition_reads.py) differs on purpose: a streaming micro-batch must not wait for
transactions still open, so its end is the last stable offset the fetch responses report.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition

Span = tuple[str, int]
"""(topic, partition)."""


def fetched_end(consumer: Consumer, span: Span) -> int:
    """The end of an assigned partition as its last fetch response told (-1: no response yet)."""
    return int(consumer.get_watermark_offsets(TopicPartition(*span), cached=True)[1])


def reached(consumer: Consumer, span: Span, next_offset: int) -> int:
    """How far a read of an assigned partition has come: its position, or `next_offset` (the
    offset after the last record taken, or where the read started) when that is further."""
    return max(int(consumer.position([TopicPartition(*span)])[0].offset), next_offset)


def spans_behind(consumer: Consumer, next_offsets: Mapping[Span, int]) -> dict[Span, tuple[int, int]]:
    """The assigned partitions a read has not taken to their end yet, as {span: (reached, end)}."""
    behind = {}
    for span, next_offset in next_offsets.items():
        at, end = reached(consumer, span, next_offset), fetched_end(consumer, span)
        if end < 0 or at < end:
            behind[span] = (at, end)
    return behind
