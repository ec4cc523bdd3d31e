"""The load the target planner sizes on, from successive worker scrapes (no HTTP: plain samples)."""

import pytest

from keyrange.autoscale.load import LoadTracker
from keyrange.autoscale.scrape import WorkerSample, parse_metrics
from keyrange.ranges.planner import SlotLag


def sample(at: float, processed: dict[int, float], handler_seconds: float = 0.0, cpu_seconds: float = 0.0,
           lag: dict[int, int] | None = None) -> WorkerSample:
    s = WorkerSample(at, processed=sum(processed.values()), handler_seconds=handler_seconds, cpu_seconds=cpu_seconds)
    s.slot_processed = dict(processed)
    s.slot_lag = {slot: SlotLag(records) for slot, records in (lag or {}).items()}
    return s


def test_no_load_before_a_worker_was_scraped_twice() -> None:
    tracker = LoadTracker(concurrency=8)
    assert tracker.load() is None
    tracker.observe(0.0, {0: sample(0.0, {0: 0})})
    assert tracker.load() is None


def test_rates_and_busy_fractions_over_the_window() -> None:
    tracker = LoadTracker(concurrency=8, warmup_seconds=0)
    tracker.observe(0.0, {0: sample(0.0, {0: 0, 1: 0}, lag={0: 0, 1: 0})})
    # 2 s later: 800 + 400 events handled, 8 s in handlers (half of 8 permits), 1.2 s of CPU,
    # and slot 0's lag grew by 200 records (100 ev/s more arrive than are handled)
    tracker.observe(2.0, {0: sample(2.0, {0: 800, 1: 400}, handler_seconds=8.0, cpu_seconds=1.2,
                                    lag={0: 200, 1: 0})})
    load = tracker.load()
    assert load is not None
    worker = load.workers[0]
    assert worker.processed_per_second == pytest.approx(600)
    assert worker.permits_busy == pytest.approx(0.5)
    assert worker.cpu_busy == pytest.approx(0.6)
    assert load.slot_rates == pytest.approx({0: 500, 1: 200})


def test_a_slot_whose_lag_was_first_measured_mid_window_is_rated_from_then_on() -> None:
    """A worker that just started drains the backlog of its start-up: what it handles then is not
    what arrives. Once its lag was measured twice, the input is what it handled since plus the
    lag's growth since (here: 381 ev/s handled, the backlog falling by 131 a second: 250 arrive)."""
    tracker = LoadTracker(concurrency=8)
    tracker.observe(0.0, {0: sample(0.0, {0: 0})})  # acquired, its end not yet read
    tracker.observe(1.0, {0: sample(1.0, {0: 381}, lag={0: 264})})
    once = tracker.load()
    assert once is not None and once.slot_rates[0] == pytest.approx(381)  # measured once: handled
    tracker.observe(2.0, {0: sample(2.0, {0: 762}, lag={0: 133})})
    twice = tracker.load()
    assert twice is not None and twice.slot_rates[0] == pytest.approx(250)


def test_a_slot_moved_mid_window_sums_over_its_owners_and_restarts_count_from_zero() -> None:
    tracker = LoadTracker(concurrency=8, warmup_seconds=0)
    tracker.observe(0.0, {0: sample(0.0, {0: 1000}), 1: sample(0.0, {})})
    tracker.observe(2.0, {0: sample(2.0, {0: 1100}), 1: sample(2.0, {0: 100})})
    load = tracker.load()
    assert load is not None and load.slot_rates[0] == pytest.approx(100)
    restarted = LoadTracker(concurrency=8, warmup_seconds=0)
    restarted.observe(0.0, {0: sample(0.0, {0: 5000})})
    restarted.observe(1.0, {0: sample(1.0, {0: 50})})  # the counter went down: the worker restarted
    again = restarted.load()
    assert again is not None and again.workers[0].processed_per_second == pytest.approx(50)


def test_old_scrapes_leave_the_window() -> None:
    tracker = LoadTracker(concurrency=8, window_seconds=5.0, warmup_seconds=0)
    tracker.observe(0.0, {0: sample(0.0, {0: 0})})
    tracker.observe(3.0, {0: sample(3.0, {0: 9000})})  # a burst
    tracker.observe(6.0, {0: sample(6.0, {0: 9300})})
    tracker.observe(8.0, {0: sample(8.0, {0: 9500})})
    load = tracker.load()
    assert load is not None and load.workers[0].processed_per_second == pytest.approx(100)


def test_the_scrape_reads_what_the_load_needs() -> None:
    text = """\
# TYPE keyrange_events_processed counter
keyrange_events_processed_total{consumer="c",worker="0",partition="0"} 10.0
keyrange_events_processed_total{consumer="c",worker="0",partition="3"} 5.0
# TYPE keyrange_handler_seconds histogram
keyrange_handler_seconds_bucket{consumer="c",worker="0",le="+Inf"} 15.0
keyrange_handler_seconds_count{consumer="c",worker="0"} 15.0
keyrange_handler_seconds_sum{consumer="c",worker="0"} 0.15
# TYPE process_cpu_seconds counter
process_cpu_seconds_total 2.5
"""
    s = parse_metrics(text, at=1.0)
    assert s.slot_processed == {0: 10, 3: 5} and s.processed == 15
    assert s.handler_seconds == pytest.approx(0.15) and s.cpu_seconds == pytest.approx(2.5)


def test_a_worker_is_warming_up_until_it_was_scraped_over_a_window_after_its_first_answer() -> None:
    """Its first seconds (imports, connecting, restoring) say nothing of what it can handle: its
    rates count from `warmup_seconds` after it first answered, or after it restarted."""
    tracker = LoadTracker(concurrency=8, window_seconds=5.0, warmup_seconds=10.0)
    for t in range(0, 11):
        tracker.observe(float(t), {0: sample(float(t), {0: 20.0 * t}, lag={0: 0})})
    early = tracker.load()
    assert early is not None and early.workers == {} and early.warming == {0}
    assert early.slot_rates[0] == pytest.approx(20)  # what arrives is measured all the same
    tracker.observe(11.0, {0: sample(11.0, {0: 200.0 + 300}, lag={0: 0})})
    warm = tracker.load()
    assert warm is not None and warm.warming == frozenset()
    assert warm.workers[0].processed_per_second == pytest.approx(300)  # from 10 s on, not from 6 s
    tracker.observe(12.0, {0: sample(12.0, {0: 5.0}, lag={0: 0})})  # the counter went down: restarted
    restarted = tracker.load()
    assert restarted is not None and restarted.warming == {0}
