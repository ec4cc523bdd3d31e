"""The demo report's key-space section: how its topic's partitions were cut into hash ranges and
which worker held each range when the most workers ran (local/demo.py `key_space`)."""

from __future__ import annotations

from pathlib import Path

from keyrange.local.demo import DemoReport, key_space, render_report
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.rangemap import RangeMap


def _report(**changes: object) -> DemoReport:
    base = dict(produced=100, duplicates_sent=1, handled=99, duplicates_dropped=1, lost=0, handled_twice=0,
                handled_twice_beyond_ttl=0, latency_ms={"p50": 3.0}, rescales=[], max_workers=4, seconds=10.0)
    return DemoReport(**{**base, **changes})  # type: ignore[arg-type]


def test_four_workers_on_two_partitions_hold_two_hash_ranges_of_each() -> None:
    space = key_space(SlotLayout.for_workers(2, 4), RangeMap.even(4, 4))
    assert (space.partitions, space.per_partition, space.workers) == (2, 2, 4)
    assert space.partition_lines() == [
        "partition 0: 2 hash ranges over 2 worker(s) (0:0/2 -> worker 0, 0:1/2 -> worker 1)",
        "partition 1: 2 hash ranges over 2 worker(s) (1:0/2 -> worker 2, 1:1/2 -> worker 3)",
    ]


def test_three_workers_split_one_partition_and_keep_the_other_whole() -> None:
    space = key_space(SlotLayout.for_workers(2, 4), RangeMap.even(4, 3))
    assert space.partition_lines() == [
        "partition 0: 2 hash ranges over 1 worker(s) (0:0/2 -> worker 0, 0:1/2 -> worker 0)",
        "partition 1: 2 hash ranges over 2 worker(s) (1:0/2 -> worker 1, 1:1/2 -> worker 2)",
    ]


def test_the_report_has_the_key_space_and_names_the_moved_ranges(tmp_path: Path) -> None:
    rescale = dict(action="split", reason="lag", epoch=3, workers_before=2, workers_after=4, moved_slots=[1, 3],
                   moved_ranges=["0:1/2", "1:1/2"], decided_ms=1_000, published_ms=1_100, settled_ms=1_500)
    md = render_report(_report(rescales=[rescale], key_space=key_space(SlotLayout(2, 2), RangeMap.even(4, 4))),
                       tmp_path)
    assert "## Key space" in md
    assert "The topic's 2 partitions are each cut into 2 hash range(s) of clientIds, 4 in all" in md
    assert "- partition 1: 2 hash ranges over 2 worker(s) (1:0/2 -> worker 2, 1:1/2 -> worker 3)" in md
    assert ("2 -> 4 workers, epoch 3, moved 0:1/2 1:1/2, handoff done in 0.5 s, pause not measured (no event of a "
            "moved range after the grant): lag") in md


def test_every_rescale_line_states_its_pause_and_whether_it_waited_out_the_read_ahead(tmp_path: Path) -> None:
    split = {"decided_ms": 1_000, "settled_ms": 1_800, "action": "split", "workers_before": 1, "workers_after": 4,
             "epoch": 2, "moved_ranges": ["0:1/2", "1"], "reason": "test", "pauses": [0.31, 0.12], "not_read_ahead": []}
    merge = {**split, "decided_ms": 61_000, "settled_ms": 72_000, "action": "merge", "workers_before": 4,
             "workers_after": 1, "epoch": 4, "pauses": [], "not_read_ahead": [0]}
    md = render_report(_report(rescales=[split, merge]), tmp_path)
    assert ("- +   0.0 s  split  1 -> 4 workers, epoch 2, moved 0:1/2 1, handoff done in 0.8 s, pause 0.31 s "
            "(largest of 2 moved range(s)): test") in md
    assert ("- +  60.0 s  merge  4 -> 1 workers, epoch 4, moved 0:1/2 1, handoff done in 11.0 s, waited out the "
            "read-ahead timeout, pause not measured (no event of a moved range after the grant): test") in md
