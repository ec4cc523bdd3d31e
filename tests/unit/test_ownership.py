"""The rules of who may hold which slot (ranges/ownership.py), without Kafka: epochs, transit,
release before acquire, handoff completion, read-ahead, and a whole handoff played through them."""

from __future__ import annotations

import pytest

from keyrange.ranges.ownership import (
    allowed_slots,
    grant,
    has_read_ahead,
    has_released,
    in_transit_towards,
    plan_handoff,
    supersedes,
    to_acquire,
    to_release,
)
from keyrange.ranges.planner import with_epoch
from keyrange.ranges.rangemap import RangeMap

TWO = RangeMap.even(6, 2)  # w0=0-2 w1=3-5
THREE = with_epoch(RangeMap.even(6, 3), 2)  # w0=0-1 w1=2-3 w2=4-5


@pytest.mark.parametrize(("epoch", "current", "replaces"), [(1, None, True), (3, 2, True), (2, 2, True), (1, 2, False)])
def test_the_newest_epoch_rules(epoch: int, current: int | None, replaces: bool) -> None:
    assert supersedes(epoch, current) is replaces


def test_a_slot_in_transit_is_allowed_to_nobody() -> None:
    transit = frozenset({2, 4})
    assert allowed_slots(THREE, transit, 0) == {0, 1}
    assert allowed_slots(THREE, transit, 1) == {3}
    assert allowed_slots(THREE, transit, 2) == {5}
    assert allowed_slots(THREE, transit, 3) == frozenset()
    assert in_transit_towards(THREE, transit, 1) == {2}
    assert in_transit_towards(THREE, transit, 0) == frozenset()


def test_release_comes_before_acquire_and_each_takes_only_its_difference() -> None:
    held, allowed = {0, 1, 2}, frozenset({1, 2, 3})
    assert to_release(held, allowed) == {0}
    assert to_acquire(held, allowed) == {3}
    assert to_release(allowed, allowed) == to_acquire(allowed, allowed) == frozenset()


def test_a_handoff_moves_only_slots_whose_owner_changes_and_awaits_their_old_owners() -> None:
    plan = plan_handoff(TWO, THREE)
    assert plan.moved == {2, 4, 5}  # slot 3 stays with w1: never in transit
    assert plan.awaiting == {0, 1}
    assert plan.moves == {1: frozenset({2}), 2: frozenset({4, 5})}
    merge = plan_handoff(THREE, with_epoch(TWO, 3))
    assert merge.moved == {2, 4, 5} and merge.awaiting == {1, 2} and merge.moves == {0: {2}, 1: {4, 5}}
    assert plan_handoff(TWO, with_epoch(TWO, 2)).moved == frozenset()


@pytest.mark.parametrize(
    ("reported_epoch", "held", "released"),
    [(1, frozenset(), False),  # an older epoch says nothing about this handoff
     (2, frozenset({0, 2}), False),  # still holds a slot in transit
     (2, frozenset({0, 1}), True),
     (3, frozenset({0}), True)],  # a newer epoch counts too
)
def test_a_release_counts_once_the_epoch_is_reported_without_the_slots(reported_epoch: int, held: frozenset[int],
                                                                        released: bool) -> None:
    assert has_released(reported_epoch, held, 2, frozenset({2, 4})) is released


def test_a_read_ahead_counts_for_its_own_prepare_and_all_of_its_slots() -> None:
    assert has_read_ahead(1, frozenset({4, 5}), 1, frozenset({4, 5}))
    assert not has_read_ahead(1, frozenset({4}), 1, frozenset({4, 5}))
    assert not has_read_ahead(0, frozenset({4, 5}), 1, frozenset({4, 5}))


def test_the_grant_is_the_same_map_under_the_next_epoch() -> None:
    granted = grant(THREE)
    assert granted.epoch == 3 and granted.assignments == THREE.assignments


def test_a_whole_handoff_never_lets_two_workers_hold_a_slot() -> None:
    """Members that follow the newest publication with release-before-acquire, a controller that
    grants only after every awaited release: at no step does a slot have two holders, and the
    moved slots end at their new owners."""
    held: dict[int, set[int]] = {0: set(TWO.slots_of(0)), 1: set(TWO.slots_of(1)), 2: set()}
    reported: dict[int, tuple[int, frozenset[int]]] = {w: (1, frozenset(s)) for w, s in held.items()}
    plan = plan_handoff(TWO, THREE)

    def apply(ranges: RangeMap, transit: frozenset[int], order: list[int]) -> None:
        for w in order:
            allowed = allowed_slots(ranges, transit, w)
            held[w] -= to_release(held[w], allowed)
            assert_no_slot_twice()
            held[w] |= to_acquire(held[w], allowed)
            assert_no_slot_twice()
            reported[w] = (ranges.epoch, frozenset(held[w]))

    def assert_no_slot_twice() -> None:
        slots = [s for owned in held.values() for s in owned]
        assert len(slots) == len(set(slots)), held

    def complete() -> bool:
        return all(has_released(*reported[w], THREE.epoch, plan.moved) for w in plan.awaiting)

    # The handoff's epoch: the moved slots are in transit, so their new owners wait while the
    # old owners release them, in whatever order the members see the publication.
    apply(THREE, plan.moved, [2, 1])
    assert held == {0: {0, 1, 2}, 1: {3}, 2: set()}
    assert not complete()  # w0 still holds slot 2: no grant yet
    apply(THREE, plan.moved, [0])
    assert complete()
    apply(grant(THREE), frozenset(), [2, 1, 0])
    assert held == {w: set(THREE.slots_of(w)) for w in held}
