"""Which copies of a micro-batch's records are duplicates, decided on the driver with Arrow.

A micro-batch's keys (uuid and sink position of each valid record, a few tens of bytes a record,
at most the micro-batch cap) come back to the driver in the same Spark job that reads and
caches the batch; the stored uuids of the minutes it touches come back in one scan. Grouping them
here, vectorized, costs no shuffle and no Spark job of its own, which matters most for the small
micro-batches of continuous mode. Pure pyarrow: no Spark needed to test it.

The copy that counts is the first in the log: the lowest sink partition, then offset (a uuid's
copies share a key, its clientId, hence a partition), and never one of this batch's if an earlier
batch stored the uuid.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

LOSER_SCHEMA = pa.schema([("uuid", pa.string()), ("win_partition", pa.int32()), ("win_offset", pa.int64())])
"""A uuid with copies to drop, and where its counted copy sits (-1, -1: stored by an earlier batch)."""
OFFSET_BITS = 40
"""A record's sink position packed in one 64-bit integer: `partition << OFFSET_BITS | offset`
(offsets stay below 2**40, a trillion records per partition; the partition goes above)."""


def duplicate_winners(keys: pa.Table, earlier_uuids: pa.Array | pa.ChunkedArray | None) -> pa.Table:
    """For every uuid in `keys` (columns uuid, sink_partition, sink_offset) that appears more than
    once or in `earlier_uuids`: the position of its counted copy (LOSER_SCHEMA). Copies of the
    batch at any other position are duplicates."""
    return deduplicate(keys, earlier_uuids)[0]


def deduplicate(keys: pa.Table, earlier_uuids: pa.Array | pa.ChunkedArray | None) -> tuple[pa.Table, int]:
    """`duplicate_winners`, and how many of the batch's records count (its uuids not stored before)."""
    if keys.num_rows == 0:
        return LOSER_SCHEMA.empty_table(), 0
    position = packed_positions(keys)
    grouped = (pa.table({"uuid": keys["uuid"], "position": position})
               .group_by("uuid").aggregate([("position", "min"), ("position", "count")]))
    if earlier_uuids is not None and len(earlier_uuids):
        in_store = pc.is_in(grouped["uuid"], value_set=pa.array(earlier_uuids, pa.string()))
    else:
        in_store = pa.repeat(False, grouped.num_rows)
    wanted = pc.or_(pc.greater(grouped["position_count"], 1), in_store)
    chosen, stored = grouped.filter(wanted), pc.filter(in_store, wanted)
    first = chosen["position_min"]
    partition = pc.if_else(stored, -1, pc.cast(pc.shift_right(first, OFFSET_BITS), pa.int32()))
    offset = pc.if_else(stored, -1, pc.bit_wise_and(first, (1 << OFFSET_BITS) - 1))
    winners = pa.table({"uuid": chosen["uuid"], "win_partition": pc.cast(partition, pa.int32()),
                        "win_offset": pc.cast(offset, pa.int64())}, schema=LOSER_SCHEMA)
    return winners, grouped.num_rows - int(pc.sum(pc.cast(in_store, pa.int64())).as_py() or 0)


def packed_positions(keys: pa.Table) -> pa.ChunkedArray:
    """Each record's sink position as one integer (OFFSET_BITS)."""
    return pc.add(pc.shift_left(pc.cast(keys["sink_partition"], pa.int64()), OFFSET_BITS), keys["sink_offset"])


def copies_to_drop(keys: pa.Table, winners: pa.Table) -> pa.Array:
    """The packed sink positions (OFFSET_BITS) of the records of `keys` that are duplicates: a copy
    of a uuid in `winners` at any position but its winner's. A position names one record of the
    topic, so dropping these leaves exactly the first deliveries."""
    if not winners.num_rows:
        return pa.array([], pa.int64())
    index = pc.index_in(keys["uuid"], value_set=winners["uuid"])
    listed = pc.is_valid(index)
    winner = pc.add(pc.shift_left(pc.cast(pc.take(winners["win_partition"], index), pa.int64()), OFFSET_BITS),
                    pc.take(winners["win_offset"], index))
    position = packed_positions(keys)
    # A stored uuid's winner is (-1, -1): no position of this batch, so every copy goes.
    drop = pc.and_(listed, pc.not_equal(position, winner))
    return pc.filter(position, pc.fill_null(drop, False)).combine_chunks()


def status_counts(statuses: pa.Array | pa.ChunkedArray) -> dict[str, int]:
    """How many records have each status."""
    return {str(row["values"]): int(row["counts"]) for row in pc.value_counts(statuses).to_pylist()}
