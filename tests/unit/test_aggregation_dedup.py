"""Deciding a micro-batch's duplicates on the driver (keyrange.aggregation.dedup), without Spark."""

from __future__ import annotations

import pyarrow as pa

from keyrange.aggregation.dedup import OFFSET_BITS, copies_to_drop, deduplicate, duplicate_winners, status_counts
from keyrange.aggregation.reference import Delivery, aggregate


def _keys(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table({"uuid": [r[0] for r in rows], "sink_partition": pa.array([r[1] for r in rows], pa.int32()),
                     "sink_offset": pa.array([r[2] for r in rows], pa.int64())})


def test_the_first_copy_in_the_log_wins_and_unique_uuids_are_not_listed():
    keys = _keys([("a", 0, 5), ("b", 0, 6), ("a", 0, 3), ("c", 1, 1), ("d", 2, 9), ("d", 2, 8), ("a", 0, 7)])
    assert sorted(duplicate_winners(keys, None).to_pylist(), key=lambda r: r["uuid"]) == [
        {"uuid": "a", "win_partition": 0, "win_offset": 3},
        {"uuid": "d", "win_partition": 2, "win_offset": 8},
    ]


def test_a_uuid_stored_by_an_earlier_batch_loses_every_copy_here():
    keys = _keys([("a", 0, 5), ("c", 1, 1), ("c", 1, 4)])
    winners = {r["uuid"]: (r["win_partition"], r["win_offset"]) for r in
               duplicate_winners(keys, pa.chunked_array([["c", "zzz"], ["a"]])).to_pylist()}
    assert winners == {"a": (-1, -1), "c": (-1, -1)}


def test_large_partitions_and_offsets_survive_the_packed_position():
    keys = _keys([("x", 70_000, 2**39 + 5), ("x", 70_000, 2**39 + 1), ("x", 69_999, 2**39 + 9)])
    assert duplicate_winners(keys, None).to_pylist() == [{"uuid": "x", "win_partition": 69_999,
                                                          "win_offset": 2**39 + 9}]


def test_an_empty_batch_has_no_duplicates_and_counts_are_per_status():
    assert duplicate_winners(_keys([]), pa.array(["a"])).num_rows == 0
    assert status_counts(pa.array(["fresh", "late", "fresh", "invalid"])) == {"fresh": 2, "late": 1, "invalid": 1}


def test_the_kept_copies_are_the_references_first_deliveries():
    """Dropping every copy not at its uuid's winning position leaves what the reference counts."""
    import orjson

    rows = [("u1", 0, 0), ("u2", 0, 1), ("u1", 0, 2), ("u3", 1, 0), ("u3", 1, 3), ("u2", 0, 4)]
    found = duplicate_winners(_keys(rows), None).to_pylist()
    winners = {r["uuid"]: (r["win_partition"], r["win_offset"]) for r in found}
    kept = [r for r in rows if winners.get(r[0], (r[1], r[2])) == (r[1], r[2])]
    deliveries = [Delivery(p, o, orjson.dumps({"clientId": 1, "uuid": u, "created": o, "startedAt": o,
                                               "finishedAt": o, "worker": "w"})) for u, p, o in rows]
    assert sorted(r[0] for r in kept) == ["u1", "u2", "u3"]
    assert aggregate(deliveries)["clients"][0]["events"] == len(kept)


def test_the_count_of_new_records_skips_copies_and_uuids_stored_before():
    keys = _keys([("a", 0, 5), ("b", 0, 6), ("a", 0, 3), ("c", 1, 1), ("c", 1, 2), ("d", 2, 9)])
    assert deduplicate(keys, None)[1] == 4
    assert deduplicate(keys, pa.chunked_array([["c", "zzz"], ["a"]]))[1] == 2
    assert deduplicate(_keys([]), pa.array(["a"]))[1] == 0


def _unpacked(positions: pa.Array) -> list[tuple[int, int]]:
    return sorted((p >> OFFSET_BITS, p & ((1 << OFFSET_BITS) - 1)) for p in positions.to_pylist())


def test_the_copies_to_drop_are_every_position_but_the_winners():
    keys = _keys([("a", 0, 5), ("b", 0, 6), ("a", 0, 3), ("c", 1, 1), ("d", 2, 9), ("d", 2, 8), ("a", 0, 7)])
    assert _unpacked(copies_to_drop(keys, duplicate_winners(keys, None))) == [(0, 5), (0, 7), (2, 9)]


def test_every_copy_of_a_stored_uuid_is_dropped_and_nothing_without_duplicates():
    keys = _keys([("a", 0, 5), ("c", 1, 1), ("c", 1, 4), ("e", 3, 2**39 + 1)])
    winners = duplicate_winners(keys, pa.chunked_array([["c", "zzz"], ["a"]]))
    assert _unpacked(copies_to_drop(keys, winners)) == [(0, 5), (1, 1), (1, 4)]
    assert copies_to_drop(keys, duplicate_winners(_keys([("x", 0, 1)]), None)).to_pylist() == []


def test_dropping_the_copies_leaves_the_references_first_deliveries():
    """What the Spark job keeps (every record but the dropped positions) is what the reference counts."""
    import orjson

    rows = [("u1", 0, 0), ("u2", 0, 1), ("u1", 0, 2), ("u3", 1, 0), ("u3", 1, 3), ("u2", 0, 4), ("u4", 70_000, 2**39)]
    keys = _keys(rows)
    dropped = set(_unpacked(copies_to_drop(keys, duplicate_winners(keys, None))))
    kept = [r for r in rows if (r[1], r[2]) not in dropped]
    deliveries = [Delivery(p, o, orjson.dumps({"clientId": 1, "uuid": u, "created": o, "startedAt": o,
                                               "finishedAt": o, "worker": "w"})) for u, p, o in rows]
    assert sorted(r[0] for r in kept) == ["u1", "u2", "u3", "u4"]
    assert sorted((r[1], r[2]) for r in kept) == [(0, 0), (0, 1), (1, 0), (70_000, 2**39)]
    assert aggregate(deliveries)["clients"][0]["events"] == len(kept)
