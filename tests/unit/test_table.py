"""The live table of `keyrange run` renders the controller's status and the measured figures."""

from keyrange.local.table import Totals, WorkerRow, render, row_lag
from keyrange.ranges.controller import ControllerStatus, Rescale
from keyrange.ranges.planner import SlotLag
from keyrange.ranges.rangemap import RangeMap


def test_table_shows_workers_ranges_lag_and_the_last_rescale() -> None:
    m = RangeMap.even(12, 2, epoch=3)
    rescale = Rescale("split", "split 0-11: range 0-11 lags 6000 records / 2.0 s", 2, 1, 2,
                      frozenset(range(6, 12)), decided_ms=10_000, published_ms=11_000, settled_ms=11_500)
    status = ControllerStatus(3, m, (SlotLag(10, 0.1), SlotLag(30, 0.4)), frozenset(), False, "lag is fine",
                              (rescale,))
    rows = [WorkerRow(0, True, "0-5", 1234.0, SlotLag(10, 0.1), 0), WorkerRow(1, False, "", 0.0, SlotLag(), 2)]
    text = render("payments", status, rows, Totals(65, 100_000, 1500.0, 0.012, 42, 1), now_ms=40_000)
    lines = text.splitlines()
    assert lines[0] == "keyrange run payments: 65 s, epoch 3, 2 workers"
    assert "handled 100,000 (1,500/s)" in lines[1] and "p99 latency 12 ms" in lines[1]
    assert "lag 40 records / 0.4 s" in lines[1] and "duplicates dropped 42" in lines[1]
    assert "last rescale: split 30 s ago (done): split 0-11" in lines[2]
    assert lines[-2].split() == ["0", "0-5", "0-5", "1,234", "10", "0.1", "0"]
    assert lines[-1].split() == ["1", "6-11", "-", "0", "0", "0.0", "2", "(down)"]


def test_table_says_when_a_handoff_waits() -> None:
    status = ControllerStatus(4, RangeMap.even(12, 1, epoch=4), (SlotLag(),), frozenset({1}), False, "x", ())
    text = render("c", status, [], Totals(1, 0, 0.0, None, 0, 0), now_ms=0)
    assert "handoff waits for worker(s) 1" in text and "p99 latency -" in text


def test_table_shows_hash_ranges_of_partitions() -> None:
    from keyrange.ranges.layout import SlotLayout

    layout = SlotLayout(2, 4)  # 2 partitions cut in quarters
    m = RangeMap.even(8, 3, epoch=2)
    status = ControllerStatus(2, m, (SlotLag(), SlotLag(), SlotLag()), frozenset(), False, "lag is fine", (),
                              layout=layout)
    rows = [WorkerRow(0, True, layout.describe_slots({0, 1, 2}), 10.0, SlotLag(), 0),
            WorkerRow(1, True, layout.describe_slots({3, 4, 5}), 10.0, SlotLag(), 0),
            WorkerRow(2, True, "", 0.0, SlotLag(), 0)]
    lines = render("c", status, rows, Totals(1, 0, 0.0, None, 0, 0), now_ms=0).splitlines()
    assert lines[-3].split()[:3] == ["0", "0:0-2/4", "0:0-2/4"]
    assert lines[-2].split()[:3] == ["1", "0:3/4-1:1/4", "0:3/4-1:1/4"]
    assert lines[-1].split()[:3] == ["2", "1:2-3/4", "-"]
    assert len({len(line) for line in lines[-3:]}) == 1, "the columns line up"


def test_a_worker_whose_slots_are_not_measured_shows_no_lag_not_zero() -> None:
    """Before a worker's first scrape, while it restarts, or while a handoff gives it slots it reports
    no lag for yet, its backlog is unknown: 0 would say it has none (issue 30)."""
    status = ControllerStatus(1, RangeMap.even(12, 2, epoch=1), (SlotLag(), SlotLag()), frozenset(), False, "x", ())
    rows = [WorkerRow(0, True, "0-5", 10.0, SlotLag(3, 0.2), 0), WorkerRow(1, True, "", 0.0, None, 0)]
    lines = render("c", status, rows, Totals(1, 0, 0.0, None, 0, 0, unmeasured_slots=6), now_ms=0).splitlines()
    assert lines[-2].split() == ["0", "0-5", "0-5", "10", "3", "0.2", "0"]
    assert lines[-1].split() == ["1", "6-11", "-", "0", "-", "-", "0"]
    assert "lag 0 records / 0.0 s (6 of 12 slots unmeasured)" in lines[1]


def test_a_run_with_no_lag_measured_yet_shows_none() -> None:
    status = ControllerStatus(0, RangeMap.even(12, 1, epoch=0), (SlotLag(),), frozenset(), False, "x", ())
    text = render("c", status, [], Totals(1, 0, 0.0, None, 0, 0, unmeasured_slots=12), now_ms=0)
    assert "   lag -   " in text.splitlines()[1]


def test_a_row_is_measured_only_when_every_assigned_slot_is() -> None:
    reported = {0: SlotLag(5, 1.0), 1: SlotLag(2, 3.0)}
    assert row_lag([0, 1], reported) == SlotLag(7, 3.0)
    assert row_lag([0, 1, 2], reported) is None, "slot 2 was handed over and not reported yet"
    assert row_lag([0, 1], None) is None, "not scraped (starting, restarting, down)"
    assert row_lag([], {}) == SlotLag(), "a spare holds nothing: nothing waits for it"
    assert row_lag([], None) is None
