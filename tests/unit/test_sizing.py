"""The capacity model: a worker's true rate from its busy fraction, demand with backlog, balanced ranges."""

import pytest

from keyrange.ranges.rangemap import RangeMap
from keyrange.ranges.sizing import (
    WorkerLoad,
    balanced_cuts,
    balanced_map,
    falling_behind,
    fewest_workers,
    fleet_capacity,
    runs_needed,
    slot_demand,
    worker_capacity,
)


def test_capacity_is_the_rate_over_the_busy_fraction() -> None:
    # 400 ev/s with 8 permits half busy: 800 ev/s when all are busy
    assert worker_capacity(WorkerLoad(400, permits_busy=0.5), behind=False) == pytest.approx(800)


def test_a_busy_cpu_caps_the_capacity_even_with_idle_permits() -> None:
    # 64 permits barely used, but the process already spends 80 % of a core
    assert worker_capacity(WorkerLoad(1000, permits_busy=0.16, cpu_busy=0.8), behind=False) == pytest.approx(1250)


def test_a_worker_falling_behind_handles_what_it_can() -> None:
    assert worker_capacity(WorkerLoad(700, permits_busy=0.3), behind=True) == 700


def test_an_idle_worker_gives_no_estimate() -> None:
    assert worker_capacity(WorkerLoad(0, permits_busy=0.0), behind=False) is None
    assert worker_capacity(WorkerLoad(3, permits_busy=0.01), behind=False) is None


def test_fleet_capacity_is_the_best_estimate() -> None:
    assert fleet_capacity([800, None, 150]) == 800  # the 150 was restoring
    assert fleet_capacity([None]) is None


def test_demand_adds_the_backlog_drained_within_the_lag_budget() -> None:
    assert slot_demand(100, 500, drain_seconds=5) == 200
    assert slot_demand(-3, 0, drain_seconds=5) == 0


def test_runs_needed_packs_contiguous_slots() -> None:
    assert runs_needed([250] * 12, 800) == 4  # 3 slots per run
    assert runs_needed([250] * 12, 200) is None  # one slot alone needs more
    assert runs_needed([0] * 12, 800) == 1


def test_fewest_workers_counts_whole_slots_not_the_total() -> None:
    # 12 slots of 250 ev/s, 1000 ev/s per worker at 80 %: 3 slots (750) per worker -> 4 workers
    assert fewest_workers([250] * 12, 1000, 0.8, low=1, high=6) == 4
    # 3000 ev/s / 800 would be 3.75, but slots of 250 fit only 3 per 800: still 4
    assert fewest_workers([250] * 12, 800, 1.0, low=1, high=6) == 4
    assert fewest_workers([250] * 12, 400, 1.0, low=1, high=6) == 6  # bounded by max
    assert fewest_workers([0] * 12, 400, 1.0, low=2, high=6) == 2  # bounded by min


def test_a_slot_hotter_than_a_worker_gets_a_range_not_the_maximum() -> None:
    # slot 0 alone needs 1,500 ev/s of 800: its own range, the other 11 slots of 50 fit in one more
    assert fewest_workers([1500] + [50] * 11, 800, 0.8, low=1, high=6) == 2


def test_balanced_cuts_minimize_the_largest_range() -> None:
    assert balanced_cuts([1] * 12, 6) == [2, 4, 6, 8, 10]
    assert balanced_cuts([10, 0, 0, 0, 10, 0], 2) == [3]  # 10 each, 3 slots each
    with pytest.raises(ValueError):
        balanced_cuts([1, 1], 3)


def test_balanced_map_keeps_owners_and_adds_the_next_ordinals() -> None:
    current = RangeMap.even(12, 2)  # w0=0-5 w1=6-11
    nxt = balanced_map(current, [1.0] * 12, 4)
    assert nxt.epoch == current.epoch + 1
    assert nxt.describe() == "epoch 2: w0=0-2 w2=3-5 w1=6-8 w3=9-11"
    assert current.moved_slots(nxt) == frozenset({3, 4, 5, 9, 10, 11})


def test_balanced_map_on_a_merge_frees_the_top_ordinals() -> None:
    current = RangeMap.even(12, 4)
    nxt = balanced_map(current, [1.0] * 12, 2)
    assert sorted(a.worker for a in nxt.assignments) == [0, 1]
    assert nxt.describe() == "epoch 2: w0=0-5 w1=6-11"


def test_falling_behind_needs_old_events_growing_input_and_a_busy_worker() -> None:
    worker = WorkerLoad(300, permits_busy=0.4, cpu_busy=0.7)
    assert falling_behind(worker, lag_seconds=11.0, input_per_second=500)
    assert not falling_behind(worker, lag_seconds=11.0, input_per_second=300)  # old lag, not growing
    assert not falling_behind(worker, lag_seconds=0.2, input_per_second=500)
    # mostly idle while events wait: waiting on something else (a restore, a slow broker)
    assert not falling_behind(WorkerLoad(20, permits_busy=0.1), lag_seconds=3.0, input_per_second=40)
