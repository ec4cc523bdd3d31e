"""The per-partition commit window: commit only below the lowest unfinished offset."""

from __future__ import annotations

import random

import pytest

from keyrange.worker.commitwindow import CommitWindow, Outcome

DONE = Outcome.HANDLED


def test_committable_is_the_lowest_unfinished_offset() -> None:
    w = CommitWindow(100)
    assert w.committable == 100
    for offset in range(100, 105):
        w.add(offset, timestamp_ms=offset)
    assert (w.committable, w.pending, w.oldest_timestamp_ms) == (100, 5, 100)
    w.finish(102, DONE)
    w.finish(101, DONE)
    assert w.committable == 100
    w.finish(100, DONE)
    assert (w.committable, w.pending, w.oldest_timestamp_ms) == (103, 2, 103)
    w.finish(104, DONE)
    w.finish(103, DONE)
    assert (w.committable, w.pending, w.oldest_timestamp_ms) == (105, 0, None)


def test_gaps_in_offsets_such_as_transaction_markers() -> None:
    w = CommitWindow(0)
    for offset in (0, 1, 5, 9):
        w.add(offset)
    for offset in (9, 0, 5):
        w.finish(offset, DONE)
    assert w.committable == 1
    w.finish(1, DONE)
    assert w.committable == 10 == w.next_offset


def test_random_completion_order_matches_a_reference() -> None:
    rng = random.Random(3)
    w = CommitWindow(0)
    offsets = list(range(5000))
    for o in offsets:
        w.add(o)
    finished: set[int] = set()
    for o in rng.sample(offsets, len(offsets)):
        w.finish(o, DONE)
        finished.add(o)
        expected = next((x for x in offsets if x not in finished), 5000)
        if o % 97 == 0:
            assert w.committable == expected


def test_offsets_must_increase() -> None:
    w = CommitWindow(10)
    w.add(10)
    with pytest.raises(ValueError, match="out of order"):
        w.add(10)


def test_outcomes_count_only_once_the_committable_offset_passes_them() -> None:
    rng = random.Random(5)
    w = CommitWindow(0)
    outcomes = {o: rng.choice(list(Outcome)) for o in range(2000)}
    for o in outcomes:
        w.add(o)
    finished: set[int] = set()
    for o in rng.sample(list(outcomes), len(outcomes)):
        w.finish(o, outcomes[o])
        finished.add(o)
        if o % 31 == 0:
            below = [outcomes[x] for x in range(w.committable)]
            assert w.passed == [below.count(kind) for kind in Outcome]
    assert w.passed == [list(outcomes.values()).count(kind) for kind in Outcome]


def test_totals_add_counts_by_outcome() -> None:
    from keyrange.worker.commitwindow import Totals

    assert Totals(1, 2, 3).plus([10, 20, 30]) == Totals(11, 22, 33)


def test_pending_bytes_follow_what_is_not_yet_committable() -> None:
    w = CommitWindow(0)
    for offset, size in enumerate((100, 200, 300)):
        w.add(offset, size_bytes=size)
    assert w.pending_bytes == 600
    w.finish(1, DONE)
    assert w.pending_bytes == 600  # offset 0 still holds the front
    w.finish(0, DONE)
    assert w.pending_bytes == 300
    w.finish(2, DONE)
    assert w.pending_bytes == 0


def test_another_slots_offsets_move_the_committable_offset_only_past_what_is_finished() -> None:
    # A hash-range slot sees every record of its partition: its own are added, the others passed.
    rng = random.Random(11)
    w = CommitWindow(0)
    mine: list[int] = []
    for o in range(2000):
        if rng.random() < 0.5:
            w.add(o)
            mine.append(o)
        else:
            w.pass_offset(o)
    w.pass_offset(5)  # delivered again below what was seen: no effect
    finished: set[int] = set()
    for o in rng.sample(mine, len(mine)):
        unfinished = [x for x in mine if x not in finished]
        assert w.committable == (unfinished[0] if unfinished else 2000)
        w.finish(o, DONE)
        finished.add(o)
    assert (w.committable, w.pending, w.passed[DONE]) == (2000, 0, len(mine))
