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

from keyrange.ranges.layout import SlotLayout
from keyrange.worker.logreader import LogReader
from keyrange.worker.snapshots import TotalsQuery, newest_totals, slot_totals_key


def slot_starts(reader: LogReader, topic: str, state_topic: str, slots: Iterable[int],
                layout: SlotLayout) -> dict[int, int]:
    """Per slot, the input offset it resumes from (module docstring)."""
    wanted = sorted(set(slots))
    partitions = sorted({layout.partition_of(s) for s in wanted})
    committed = reader.start_offsets(topic, partitions)
    if not layout.splits_partitions:
        return {s: committed[s] for s in wanted}
    queries = {s: TotalsQuery(layout.partition_of(s), slot_totals_key(layout, s), None) for s in wanted}
    newest = newest_totals(reader, state_topic, queries)
    starts = {}
    for s in wanted:
        record = newest[s]
        starts[s] = committed[layout.partition_of(s)] if record is None else record[0]
    return starts
