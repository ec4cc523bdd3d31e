"""RangeMap invariants, splits and merges that move the fewest slots, JSON round trip."""

import pytest

from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.planner import SlotLag, merge, split
from keyrange.ranges.rangemap import Assignment, RangeMap, SlotRange


def test_even_map_covers_every_slot_once() -> None:
    m = RangeMap.even(12, 5)
    assert [str(a.range) for a in m] == ["0-2", "3-5", "6-7", "8-9", "10-11"]
    assert [m.owner_of(s) for s in range(12)] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4]
    assert m.slots_of(2) == frozenset({6, 7})
    assert m.slots_of(9) == frozenset()


@pytest.mark.parametrize(
    ("assignments", "slot_count", "problem"),
    [
        ((Assignment(SlotRange(1, 11), 0),), 12, "contiguous from slot 0"),
        ((Assignment(SlotRange(0, 5), 0), Assignment(SlotRange(7, 11), 1)), 12, "contiguous"),
        ((Assignment(SlotRange(0, 5), 0),), 12, "cover slots 0..5"),
        ((Assignment(SlotRange(0, 5), 0), Assignment(SlotRange(6, 11), 0)), 12, "ordinals 0..n-1"),
        ((Assignment(SlotRange(0, 5), 0), Assignment(SlotRange(6, 11), 2)), 12, "ordinals 0..n-1"),
    ],
)
def test_invalid_maps_are_rejected(assignments: tuple[Assignment, ...], slot_count: int, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        RangeMap(1, slot_count, assignments)


def test_json_round_trip_and_malformed_input() -> None:
    m = RangeMap.even(12, 3, epoch=7)
    assert RangeMap.from_json(m.to_json()) == m
    with pytest.raises(ValueError, match="malformed"):
        RangeMap.from_json({"epoch": 1})
    with pytest.raises(ValueError, match="not contiguous"):
        RangeMap.from_json({"epoch": 1, "slotCount": 3, "ranges": [{"slots": "0,2", "worker": 0}]})


def test_split_balances_lag_and_moves_the_smaller_side_to_a_new_ordinal() -> None:
    m = RangeMap.even(12, 2)  # w0=0-5 w1=6-11
    lag = {6: SlotLag(900), 7: SlotLag(10), 8: SlotLag(10), 9: SlotLag(10), 10: SlotLag(10), 11: SlotLag(10)}
    nxt = split(m, 1, lag)
    assert nxt.describe() == "epoch 2: w0=0-5 w2=6 w1=7-11"
    assert m.moved_slots(nxt) == frozenset({6})


def test_split_without_lag_cuts_in_the_middle() -> None:
    nxt = split(RangeMap.even(12, 1), 0, {})
    assert nxt.describe() == "epoch 2: w0=0-5 w1=6-11"


def test_single_slot_range_cannot_split() -> None:
    with pytest.raises(ValueError, match="single slot"):
        split(RangeMap.even(2, 2), 0, {})


def test_merge_frees_the_top_ordinal_when_it_is_in_the_pair() -> None:
    m = RangeMap(5, 12, (Assignment(SlotRange(0, 3), 0), Assignment(SlotRange(4, 5), 2),
                         Assignment(SlotRange(6, 11), 1)))
    nxt = merge(m, 0)
    assert nxt.describe() == "epoch 6: w0=0-5 w1=6-11"
    assert m.moved_slots(nxt) == frozenset({4, 5})


def test_merge_of_a_pair_without_the_top_ordinal_moves_the_fewest_slots() -> None:
    # w2 (top) owns 0-1; merging 2-7 (w0) with 8-11 (w1) frees one of them, and w2's 2 slots move
    # to the freed ordinal: keep w0 and move 8-11 (4 slots) + relabel 0-1 (2) = 6 moved.
    m = RangeMap(1, 12, (Assignment(SlotRange(0, 1), 2), Assignment(SlotRange(2, 7), 0),
                         Assignment(SlotRange(8, 11), 1)))
    nxt = merge(m, 1)
    assert nxt.workers == 2
    assert m.moved_slots(nxt) == frozenset({0, 1, 8, 9, 10, 11})
    assert nxt.range_of(0) == SlotRange(2, 11)


def test_merge_needs_an_adjacent_pair() -> None:
    with pytest.raises(ValueError, match="no adjacent pair"):
        merge(RangeMap.even(12, 2), 1)


def test_with_its_layout_a_map_shows_partitions_and_hash_ranges_and_its_json_keeps_slot_numbers() -> None:
    m = RangeMap.even(8, 3, epoch=4)  # 2 partitions, each cut in quarters: slots 0-2, 3-5, 6-7
    layout = SlotLayout(2, 4)
    assert m.describe(layout) == "epoch 4: w0=0:0-2/4 w1=0:3/4-1:1/4 w2=1:2-3/4"
    assert m.describe_owners(layout) == "w0=0:0-2/4 w1=0:3/4-1:1/4 w2=1:2-3/4"
    assert m.describe() == "epoch 4: w0=0-2 w1=3-5 w2=6-7"
    assert RangeMap.even(8, 2).describe(SlotLayout(8)) == "epoch 1: w0=0-3 w1=4-7"
    assert m.to_json() == {"epoch": 4, "slotCount": 8, "ranges": [
        {"slots": "0-2", "worker": 0}, {"slots": "3-5", "worker": 1}, {"slots": "6-7", "worker": 2}]}
    with pytest.raises(ValueError, match="the layout has 12 slots, the range map 8"):
        m.describe(SlotLayout(3, 4))
