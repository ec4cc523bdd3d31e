"""Where each slot resumes: the input offset below which everything of it is finished and committed.

A whole-partition slot's position is the consumer group's committed offset for its partition,
written by the slot's transactions (as users' tools read it). Slots that are hash ranges inside a
partition share that partition's group offset, so each one's position is the offset its newest
totals record counts up to (the changelog record its transactions write with their outputs:
snapshots.py). A slot whose changelog holds none resumes from the group's committed offset, which is
never past any slot's position (the controller commits the lowest: controller.py), or from the
partition's first offset.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer

from keyrange.ranges.layout import SlotLayout
from keyrange.worker.consumer import worker_client_id
from keyrange.worker.logreader import LogReader
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.snapshots import TotalsQuery, newest_totals, slot_totals_key


def committed_so_far_lookup(settings: WorkerSettings) -> Consumer:
    """A consumer that only looks up the group's committed offsets, answering with those committed so
    far. A read_committed consumer asks the broker for stable offsets, and Kafka holds that answer
    back while any transaction carrying offsets of the partitions is open: a read-ahead beside an old
    owner that commits back to back on a busy machine then waits seconds for a moment when none is.
    It never fetches, so its isolation level reads no record. The acquire's restore uses it too, once
    the slots' producers are initialised: every earlier transaction of them is then decided, and
    offsets still pending are a fenced producer's late write, which a stable lookup would wait for
    until the new owner commits (docs/kafka.md)."""
    return Consumer(settings.clients.consumer(settings.group_id, {"client.id": worker_client_id(settings, "offsets")},
                                              isolation_level="read_uncommitted"))


def slot_starts(reader: LogReader, topic: str, state_topic: str, slots: Iterable[int],
                layout: SlotLayout, lookup: Consumer | None = None) -> dict[int, int]:
    """Per slot, the input offset it resumes from (module docstring); the group's offsets looked up
    through `lookup` when given (`committed_so_far_lookup`)."""
    wanted = sorted(set(slots))
    partitions = sorted({layout.partition_of(s) for s in wanted})
    committed = reader.start_offsets(topic, partitions, lookup)
    if not layout.splits_partitions:
        return {s: committed[s] for s in wanted}
    queries = {s: TotalsQuery(layout.partition_of(s), slot_totals_key(layout, s), None) for s in wanted}
    newest = newest_totals(reader, state_topic, queries)
    starts = {}
    for s in wanted:
        record = newest[s]
        starts[s] = committed[layout.partition_of(s)] if record is None else record[0]
    return starts
