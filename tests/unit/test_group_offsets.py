"""The group's committed offset per partition when partitions are cut into hash ranges
(ranges/groupoffsets.py): the lowest position of the partition's slots, only forward."""

from __future__ import annotations

from keyrange.ranges.channel import WorkerReport
from keyrange.ranges.groupoffsets import lowest_positions
from keyrange.ranges.layout import SlotLayout

LAYOUT = SlotLayout(2, 3)


def report(worker: int, positions: dict[int, int]) -> WorkerReport:
    return WorkerReport(worker, 1, frozenset(positions), 0, positions=positions)


def test_a_partition_gets_the_lowest_position_of_its_slots_once_every_slot_has_one() -> None:
    known: dict[int, int] = {}
    reports = {0: report(0, {0: 50, 1: 70}), 1: report(1, {2: 40, 3: 9})}
    assert lowest_positions(LAYOUT, known, reports) == {0: 40}  # partition 1 lacks slots 4 and 5
    reports[2] = report(2, {4: 12, 5: 30})
    assert lowest_positions(LAYOUT, known, reports) == {0: 40, 1: 9}


def test_positions_only_move_forward_and_survive_a_slot_in_transit() -> None:
    known: dict[int, int] = {}
    lowest_positions(LAYOUT, known, {0: report(0, {0: 50, 1: 70, 2: 60})})
    # Slot 2 moved: its old owner's report no longer has it, its new owner reported an older view.
    reports = {0: report(0, {0: 55, 1: 71}), 1: report(1, {2: 58})}
    assert lowest_positions(LAYOUT, known, reports) == {0: 55}
    assert known[2] == 60


def test_a_report_round_trips_its_positions_and_whole_partitions_send_none() -> None:
    r = report(3, {4: 12, 5: 30})
    assert WorkerReport.decode(r.encode()).positions == {4: 12, 5: 30}
    plain = WorkerReport(3, 1, frozenset({1}), 0)
    assert b"positions" not in plain.encode()
    assert WorkerReport.decode(plain.encode()).positions == {}
