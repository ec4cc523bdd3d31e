"""The load the target planner sizes on, from successive scrapes of the workers' /metrics.

Over a trailing window, per worker: events handled per second, the fraction of its handler
permits in use (`keyrange_handler_seconds_sum` per second / concurrency) and of a core its process
used (`process_cpu_seconds_total`); per slot: the input rate, i.e. what its owners handled plus
how fast its lag grew. A counter that went down (a restarted worker) counts from zero. The local
supervisor and the operator's pod scraper both feed one (`observe`) and hand `load` to the
controller.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from keyrange.autoscale.scrape import WorkerSample, merged_lag
from keyrange.ranges.sizing import Load, WorkerLoad

WINDOW_SECONDS = 5.0
"""Rates are measured over this trailing window."""


def _delta(newer: float, older: float) -> float:
    return newer - older if newer >= older else newer


class LoadTracker:
    """Keeps each worker's scrapes of the trailing window and the merged lag at each scrape
    (thread-safe: the scraper observes while the controller's thread reads the load)."""

    def __init__(self, concurrency: int, window_seconds: float = WINDOW_SECONDS) -> None:
        self.concurrency = concurrency
        self.window_seconds = window_seconds
        self._samples: dict[int, list[WorkerSample]] = {}
        self._lag: list[tuple[float, dict[int, int]]] = []
        self._lock = threading.Lock()

    def observe(self, at: float, samples: Mapping[int, WorkerSample]) -> None:
        """One round of scrapes taken at `at` (caller's clock): worker ordinal -> its sample."""
        with self._lock:
            self._observe(at, samples)

    def _observe(self, at: float, samples: Mapping[int, WorkerSample]) -> None:
        for ordinal, sample in samples.items():
            self._samples.setdefault(ordinal, []).append(sample)
        for ordinal in list(self._samples):
            kept = [s for s in self._samples[ordinal] if at - s.at <= self.window_seconds]
            if ordinal not in samples and not kept:
                del self._samples[ordinal]  # a worker that stopped answering a whole window ago
            else:
                self._samples[ordinal] = kept or self._samples[ordinal][-1:]
        self._lag.append((at, {s: x.records for s, x in merged_lag(samples.values()).items()}))
        self._lag = [p for p in self._lag if at - p[0] <= self.window_seconds] or self._lag[-1:]

    def load(self) -> Load | None:
        """Rates over the window, or None until some worker was scraped twice."""
        with self._lock:
            return self._load()

    def _load(self) -> Load | None:
        workers: dict[int, WorkerLoad] = {}
        slot_rates: dict[int, float] = {}
        for ordinal, points in self._samples.items():
            first, last = points[0], points[-1]
            seconds = last.at - first.at
            if seconds <= 0:
                continue
            workers[ordinal] = WorkerLoad(
                _delta(last.processed, first.processed) / seconds,
                permits_busy=_delta(last.handler_seconds, first.handler_seconds) / seconds / self.concurrency,
                cpu_busy=_delta(last.cpu_seconds, first.cpu_seconds) / seconds,
            )
            for slot, count in last.slot_processed.items():
                handled = _delta(count, first.slot_processed.get(slot, 0.0)) / seconds
                slot_rates[slot] = slot_rates.get(slot, 0.0) + handled
        if not workers:
            return None
        (t0, lag0), (t1, lag1) = self._lag[0], self._lag[-1]
        if t1 > t0:
            for slot in lag0.keys() & lag1.keys():
                grown = slot_rates.get(slot, 0.0) + (lag1[slot] - lag0[slot]) / (t1 - t0)
                slot_rates[slot] = max(0.0, grown)
        return Load(slot_rates, workers)
