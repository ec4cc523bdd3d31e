"""The pure figures of a run's rescales (local/scaling_report.py): pauses, flaps, time to size."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from keyrange.local.scaling_report import (
    ScalingSummary,
    SizeChange,
    describe_pauses,
    first_starts,
    flaps,
    handoff_pauses,
    needed_workers,
    summary_lines,
    time_to_size,
)


@dataclass
class Moved:
    moved_slots: frozenset[int]
    published_ms: int
    settled_ms: int | None


def test_a_pause_runs_from_the_transit_to_the_new_owners_first_event_after_the_grant() -> None:
    processed = [
        {"partition": 3, "startedAt": 900, "created": 850},  # the old owner, before the transit
        {"partition": 3, "startedAt": 1_400, "created": 950},  # the new owner's first: waited since 1_000
        {"partition": 3, "startedAt": 1_500, "created": 1_450},
        {"partition": 4, "startedAt": 1_300, "created": 1_250},  # created after the transit: waited 50 ms
        {"partition": 0, "startedAt": 1_100, "created": 1_000},  # a slot that did not move
    ]
    starts = first_starts(processed, lambda r: r["partition"])
    rescale = Moved(frozenset({3, 4, 5}), published_ms=1_000, settled_ms=1_200)
    assert handoff_pauses(starts, rescale) == [0.4, 0.05]  # slot 5 had no event: no pause
    assert handoff_pauses(starts, rescale, until_ms=1_350) == [0.05]  # slot 3's first is the next handoff's
    assert handoff_pauses(starts, Moved(frozenset({3}), 1_000, None)) == []  # never granted


def test_flaps_count_a_split_after_a_merge() -> None:
    assert flaps([1, 3, 4, 1]) == 0
    assert flaps([1, 2, 1, 2, 1]) == 1
    assert flaps([2, 1, 2, 1, 2]) == 2


def test_a_split_that_answers_a_rise_of_the_offered_load_after_a_merge_is_not_a_flap() -> None:
    # The demo's start: merged at 400 events/s, split when the burst of 3,000 came.
    assert flaps([2, 1, 4], offered=[400, 400, 3_000]) == 0
    # Merged when the burst ended, split again at the same quiet rate: the 2 -> 1 -> 2 of the issue.
    assert flaps([4, 2, 1, 2], offered=[3_000, 300, 300, 300]) == 1
    assert flaps([2, 1, 2], offered=[400, 400, 300]) == 1  # the load fell: still a flap
    with pytest.raises(ValueError, match="3 sizes but 2 offered rates"):
        flaps([2, 1, 2], offered=[400, 400])


def test_time_to_size_is_from_the_burst_to_the_decision_that_reached_the_needed_size() -> None:
    changes = [SizeChange(5_000, 2), SizeChange(12_000, 3), SizeChange(17_500, 4), SizeChange(60_000, 1)]
    assert time_to_size(changes, 10_000, 4) == 7.5
    assert time_to_size(changes, 10_000, 3) == 2.0
    assert time_to_size(changes, 10_000, 5) is None
    assert time_to_size([SizeChange(5_000, 4)], 10_000, 4) == 0.0  # reached before the burst, kept


def test_a_handoffs_pause_is_described_by_its_largest_moved_range() -> None:
    assert describe_pauses([0.12, 0.4]) == "pause 0.40 s (largest of 2 moved range(s))"
    assert describe_pauses([]) == "pause not measured (no event of a moved range after the grant)"


def test_the_burst_needs_the_workers_its_rate_fills_to_the_target_utilization() -> None:
    # The demo: 1,200 events/s, 4 permits of 10 ms (400/s a worker), 80 % busy at most.
    assert needed_workers(1200, 4, 10, 4, 0.8) == 4
    assert needed_workers(1200, 4, 10, 3, 0.8) == 3  # within workers.max
    assert needed_workers(100, 4, 10, 4, 0.8) == 1


def test_the_summary_states_time_to_size_decisions_flaps_pauses_and_the_quiet_latency() -> None:
    summary = ScalingSummary(1200, 25, 4, 7.46, splits=2, merges=2, flaps=0, read_ahead_waits=1,
                             pauses=(0.1, 0.2, 0.9), quiet_latency_ms={"p50": 12.0, "p90": 20.0, "p99": 840.0,
                                                                      "max": 1300.0})
    assert summary_lines(summary) == [
        "- time to size: the burst (1,200 events/s from +25 s) needs 4 workers: reached 7.5 s after the burst began",
        "- scale decisions: 4 (2 split, 2 merge); flaps (a split after a merge, the offered load not risen): 0; "
        "handoffs that waited out the read-ahead timeout: 1",
        "- handoff pauses: 3 moved range(s), p50 0.20 s, p99 0.90 s, max 0.90 s",
        "- latency of the events created after the burst: p50 12 ms  p99 840 ms  max 1,300 ms",
    ]
    never = summary_lines(ScalingSummary(1200, 25, 4, None, 0, 0, 0, 0, (), {}))
    assert never[0].endswith("needs 4 workers: never reached")
    assert never[2:] == ["- handoff pauses: none measured",
                         "- latency of the events created after the burst: no events"]
