"""Slot layouts: hash ranges of clientIds inside partitions (ranges/layout.py)."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from keyrange.ranges.layout import HASH_SPACE, MAX_ROUTED_KEYS, SlotLayout, SlotRouter, slot_of_label
from keyrange.ranges.slots import murmur2, partition_for_client


@pytest.mark.parametrize(("partitions", "max_workers", "per_partition"), [
    (12, 6, 1), (4, 4, 1), (4, 8, 2), (2, 5, 3), (1, 4, 4), (1, 1, 1), (3, 1, 1),
])
def test_a_layout_cuts_partitions_only_when_there_are_fewer_than_workers(partitions: int, max_workers: int,
                                                                         per_partition: int) -> None:
    layout = SlotLayout.for_workers(partitions, max_workers)
    assert layout.per_partition == per_partition
    assert layout.slot_count >= max_workers
    assert layout.splits_partitions == (per_partition > 1)


def test_with_one_slot_per_partition_a_slot_is_its_partition() -> None:
    layout = SlotLayout(5)
    router = SlotRouter(layout)
    for p in range(5):
        assert layout.partition_of(p) == p
        assert list(layout.slots_of_partition(p)) == [p]
        assert layout.hash_range(p) == (0, HASH_SPACE)
        assert layout.describe_slot(p) == str(p)
        assert router.slot_of(p, b"anything") == p


@pytest.mark.parametrize("per_partition", [2, 3, 4, 7, 8])
def test_hash_ranges_tile_the_hash_space_and_agree_with_routing(per_partition: int) -> None:
    layout = SlotLayout(3, per_partition)
    for p in range(3):
        ranges = [layout.hash_range(s) for s in layout.slots_of_partition(p)]
        assert ranges[0][0] == 0 and ranges[-1][1] == HASH_SPACE
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        for s, (lo, hi) in zip(layout.slots_of_partition(p), ranges, strict=True):
            assert lo < hi
            # Both ends of each range route to it: the boundaries are exact.
            assert layout.slot_for_hash(p, lo) == s
            assert layout.slot_for_hash(p, hi - 1) == s


def test_a_client_lies_in_its_partition_and_in_the_slot_whose_hash_range_holds_it() -> None:
    layout = SlotLayout(4, 3)
    for client in range(2_000):
        key = str(client).encode()
        partition = partition_for_client(client, layout.partitions)
        slot = layout.slot_for_key(partition, key)
        assert layout.partition_of(slot) == partition
        lo, hi = layout.hash_range(slot)
        assert lo <= murmur2(key) & 0x7FFFFFFF < hi


def test_clients_spread_evenly_over_the_slots_of_a_partition() -> None:
    # The partitioner uses the hash's low bits (h % 4), the slot its high bits: independent.
    layout = SlotLayout(4, 4)
    counts = Counter(layout.slot_for_key(partition_for_client(c, 4), str(c).encode()) for c in range(40_000))
    assert sorted(counts) == list(range(16))
    assert min(counts.values()) > 0.85 * 40_000 / 16
    assert max(counts.values()) < 1.15 * 40_000 / 16


def test_a_slot_range_is_whole_partitions_plus_hash_ranges_at_its_ends() -> None:
    layout = SlotLayout(3, 4)
    # Slots 2..9: the upper half of partition 0, all of partition 1, the lower half of partition 2.
    covered = [(layout.partition_of(s), layout.hash_range(s)) for s in range(2, 10)]
    assert [p for p, _ in covered] == [0, 0, 1, 1, 1, 1, 2, 2]
    assert covered[0][1][0] == HASH_SPACE // 2 and covered[-1][1][1] == HASH_SPACE // 2
    assert [layout.describe_slot(s) for s in (2, 4, 9)] == ["0:2/4", "1:0/4", "2:1/4"]


def test_a_range_map_whose_slots_no_longer_divide_the_partitions_is_refused_with_the_fix() -> None:
    assert SlotLayout.of_slot_count(4, 8) == SlotLayout(4, 2)
    assert SlotLayout.of_slot_count(4, 4) == SlotLayout(4, 1)
    with pytest.raises(ValueError, match=r"6 partitions.*partitions added.*new groupId"):
        SlotLayout.of_slot_count(6, 8)
    with pytest.raises(ValueError, match="partitions added"):
        SlotLayout.of_slot_count(6, 4)


def test_slots_outside_the_layout_are_refused_by_name() -> None:
    layout = SlotLayout(2, 2)
    with pytest.raises(ValueError, match=r"slot 4 does not exist: the layout has 4 slots \(2 partitions x 2\)"):
        layout.partition_of(4)
    with pytest.raises(ValueError, match="partition 2 does not exist"):
        layout.slots_of_partition(2)
    with pytest.raises(ValueError, match="at least one"):
        SlotLayout(0)
    with pytest.raises(ValueError, match="at least one slot per partition"):
        SlotLayout(2, 0)


def test_the_router_agrees_with_the_layout_and_forgets_keys_past_its_bound() -> None:
    layout = SlotLayout(2, 5)
    router = SlotRouter(layout)
    rng = random.Random(7)
    keys = [str(rng.randrange(10**9)).encode() for _ in range(3_000)]
    for key in keys + keys:  # the second pass answers from the cache
        p = partition_for_client(key.decode(), 2)
        assert router.slot_of(p, key) == layout.slot_for_key(p, key)
    # A record without a key belongs to its partition's first slot (its dead letter is written there).
    assert router.slot_of(1, None) == 5
    for i in range(MAX_ROUTED_KEYS + 10):
        router.slot_of(0, i.to_bytes(4, "big"))
        assert len(router) <= MAX_ROUTED_KEYS
    assert router.slot_of(0, keys[0]) == layout.slot_for_key(0, keys[0])


def test_a_slot_label_names_the_slot_back() -> None:
    layout = SlotLayout(3, 4)
    for slot in range(layout.slot_count):
        assert slot_of_label(layout.describe_slot(slot)) == slot
    assert slot_of_label("7") == 7
    with pytest.raises(ValueError, match="part 4 of 4"):
        slot_of_label("1:4/4")
    with pytest.raises(ValueError):
        slot_of_label("one")


@pytest.mark.parametrize(("first", "last", "shown"), [
    (0, 3, "0"), (0, 7, "0-1"), (4, 11, "1-2"),  # whole partitions: partition numbers only
    (1, 1, "0:1/4"), (0, 1, "0:0-1/4"), (2, 3, "0:2-3/4"),  # parts of one partition's hash range
    (2, 5, "0:2/4-1:1/4"), (2, 11, "0:2/4-2:3/4"), (3, 4, "0:3/4-1:0/4"),  # across partitions
])
def test_a_range_shows_as_partitions_and_parts_of_their_hash_range(first: int, last: int, shown: str) -> None:
    assert SlotLayout(3, 4).describe_range(first, last) == shown


def test_with_whole_partitions_a_range_shows_as_before() -> None:
    layout = SlotLayout(12)
    assert [layout.describe_range(0, 5), layout.describe_range(7, 7)] == ["0-5", "7"]
    assert layout.describe_slots([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"


def test_held_slots_show_run_by_run() -> None:
    layout = SlotLayout(2, 4)
    assert layout.describe_slots({5, 0, 1, 6, 7}) == "0:0-1/4,1:1-3/4"
    assert layout.describe_slots(range(8)) == "0-1"
    assert layout.describe_slots([]) == ""
    with pytest.raises(ValueError, match="slot 8 does not exist"):
        layout.describe_range(7, 8)


def test_a_keys_part_is_its_slot_within_its_partition_and_is_remembered() -> None:
    layout = SlotLayout(3, 4)
    router = SlotRouter(layout)
    key = b"client-42"
    assert key not in router.known_parts
    assert router.part_of(key) == layout.slot_for_key(2, key) % 4 == router.slot_of(2, key) - 8
    assert router.known_parts[key] == router.part_of(key)
    assert router.part_of(None) == 0 and None not in router.known_parts
