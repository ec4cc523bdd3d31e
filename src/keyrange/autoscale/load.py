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
        if not workers:
            return None
        slot_rates: dict[int, float] = {}
        t1, lag1 = self._lag[-1]
        slots = {slot for points in self._samples.values() for slot in points[-1].slot_processed} | lag1.keys()
        for slot in slots:
            # From the first scrape that measured its lag: before that it may have drained a backlog.
            since = next(((t, lag[slot]) for t, lag in self._lag if slot in lag), None) if slot in lag1 else None
            if since is None or since[0] >= t1:
                slot_rates[slot] = self._handled(slot, None)
            else:
                grown = (lag1[slot] - since[1]) / (t1 - since[0])
                slot_rates[slot] = max(0.0, self._handled(slot, since[0]) + grown)
        return Load(slot_rates, workers)

    def _handled(self, slot: int, since: float | None) -> float:
        """Events of `slot` its owners handled per second over the window (from `since` on)."""
        rate = 0.0
        for points in self._samples.values():
            kept = points if since is None else [p for p in points if p.at >= since]
            if len(kept) < 2 or kept[-1].at <= kept[0].at or slot not in kept[-1].slot_processed:
                continue
            first, last = kept[0], kept[-1]
            rate += _delta(last.slot_processed[slot], first.slot_processed.get(slot, 0.0)) / (last.at - first.at)
        return rate
