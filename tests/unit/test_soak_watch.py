"""The soak's judgement of "lag read 0 while events wait" (benchmarks/soak_embedded.py's `Watch`), on
made-up events and scrapes: an event waits from `wait` after it reached the log until its handler
starts; before that (created `wait` ago, not yet in the log for `wait`) it is in transit."""

from __future__ import annotations

from benchmarks.soak_embedded import JUDGE_AFTER_MS, Watch

WAIT_MS = 2000


def judged(watch: Watch) -> tuple[int, int, int, int]:
    """Read a handled event far enough past every scrape that all are judged; the first minute's
    (scrapes, lag 0 while waiting, transit, unreported)."""
    watch.on_processed("late", 0, 10 * JUDGE_AFTER_MS)
    watch.judge()
    m = watch.minutes[0]
    return m.scrapes, m.lag_zero_waiting, m.transit, m.unreported_waiting


def test_an_event_in_the_log_for_longer_than_the_wait_and_not_started_counts_against_lag_0() -> None:
    watch = Watch(WAIT_MS, 0)
    watch.on_input("a", 0, created=0, received=100)  # waits from 2,100 until it starts at 5,000
    watch.on_scrape(2500, {0: 0}, 1, 0.0)
    watch.on_scrape(3000, {0: 7}, 1, 0.0)
    watch.on_processed("a", 0, 5000)
    assert judged(watch) == (2, 1, 0, 0)


def test_an_event_that_reached_the_log_late_is_in_transit_first() -> None:
    watch = Watch(WAIT_MS, 0)
    watch.on_input("b", 1, created=0, received=3000)  # transit 2,000-5,000, then waits until 6,000
    watch.on_scrape(2500, {1: 0}, 1, 0.0)
    watch.on_scrape(5500, {1: 0}, 1, 0.0)
    watch.on_processed("b", 0, 6000)
    assert judged(watch) == (2, 1, 1, 0)


def test_started_events_and_partitions_no_worker_reports_are_not_lag_0() -> None:
    watch = Watch(WAIT_MS, 0)
    watch.on_input("c", 2, created=0, received=10)  # started at 1,000: never waits
    watch.on_processed("c", 0, 1000)
    watch.on_input("d", 3, created=0, received=10)  # never handled: waits from 2,010
    watch.on_scrape(2500, {2: 0}, 1, 0.0)  # partition 3 unreported (a handoff)
    assert judged(watch) == (1, 0, 0, 1)


def test_a_duplicate_and_a_processed_record_read_before_its_input_are_one_event() -> None:
    watch = Watch(WAIT_MS, 0)
    watch.on_processed("e", 0, 4000)  # the soak's reader got the output first
    watch.on_input("e", 4, created=0, received=100)  # waited 2,100-4,000
    watch.on_input("e", 4, created=0, received=4500)  # its duplicate: dropped by the worker, not waiting
    watch.on_scrape(3000, {4: 0}, 1, 0.0)
    watch.on_scrape(7000, {4: 0}, 1, 0.0)
    assert judged(watch) == (2, 1, 0, 0)


def test_scrapes_during_a_halt_are_judged_once_the_reader_has_read_past_them() -> None:
    watch = Watch(WAIT_MS, 0)
    watch.on_input("f", 5, created=0, received=10)  # never handled: no worker handles anything
    watch.on_scrape(3000, {}, 0, 0.0)  # no worker reports the partition
    watch.on_scrape(4000, {5: 0}, 1, 0.0)
    watch.on_input("g", 6, created=4000 + JUDGE_AFTER_MS, received=4000 + JUDGE_AFTER_MS)
    watch.judge()
    m = watch.minutes[0]
    assert (m.scrapes, m.lag_zero_waiting, m.unreported_waiting) == (2, 1, 1)
