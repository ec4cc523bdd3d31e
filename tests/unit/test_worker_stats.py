"""The worker's in-process latency sample and the summary's percentiles."""

from __future__ import annotations

import itertools

from keyrange.worker.stats import MAX_LATENCY_SAMPLES, WorkerStats, percentile, percentiles


def test_a_long_interval_keeps_a_bounded_evenly_spread_sample_of_its_latencies() -> None:
    stats = WorkerStats()
    n = 150_000  # 5 s at 30,000 events/s
    for i in range(n):
        stats.note_latency(float(i))

    kept = stats.take_latencies()
    assert MAX_LATENCY_SAMPLES // 2 <= len(kept) < MAX_LATENCY_SAMPLES
    strides = {b - a for a, b in itertools.pairwise(kept)}
    assert len(strides) == 1  # evenly spread over the whole interval, from its first latency on
    assert kept[0] == 0.0 and n - 1 - kept[-1] < strides.pop()
    assert abs(percentile(kept, 0.5) - n / 2) < n * 0.005
    assert abs(percentile(kept, 0.99) - n * 0.99) < n * 0.005


def test_taking_the_latencies_starts_the_next_interval_keeping_every_one_again() -> None:
    stats = WorkerStats()
    for i in range(3 * MAX_LATENCY_SAMPLES):
        stats.note_latency(float(i))
    stats.take_latencies()

    for i in range(10):
        stats.note_latency(float(i))
    assert stats.take_latencies() == [float(i) for i in range(10)]
    assert stats.take_latencies() == []


def test_percentiles_by_nearest_rank_sort_once_for_several_quantiles() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentiles(values, 0.5, 0.99, 1.0) == [50.0, 99.0, 100.0]  # the 50th, 99th, 100th smallest
    assert percentiles([1.0, 2.0, 3.0], 0.0, 0.34) == [1.0, 2.0]
    assert percentile(values, 0.5) == 50.0
    assert percentiles([], 0.5, 0.99) == [0.0, 0.0]
