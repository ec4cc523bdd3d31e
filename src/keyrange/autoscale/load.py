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
WARMUP_SECONDS = 10.0
"""A worker's rates count from this long after it first answered (or restarted): before that it
imports, connects and restores, and what it handles says nothing of what it can handle."""


def _delta(newer: float, older: float) -> float:
    return newer - older if newer >= older else newer


class LoadTracker:
    """Keeps each worker's scrapes of the trailing window and the merged lag at each scrape
    (thread-safe: the scraper observes while the controller's thread reads the load)."""

    def __init__(self, concurrency: int, window_seconds: float = WINDOW_SECONDS,
                 warmup_seconds: float = WARMUP_SECONDS) -> None:
        self.concurrency = concurrency
        self.window_seconds = window_seconds
        self.warmup_seconds = warmup_seconds
        self._samples: dict[int, list[WorkerSample]] = {}
        self._warm_from: dict[int, float] = {}
        """Worker ordinal -> from when its rates tell its capacity."""
        self._lag: list[tuple[float, dict[int, int]]] = []
        self._lock = threading.Lock()

    def observe(self, at: float, samples: Mapping[int, WorkerSample]) -> None:
        """One round of scrapes taken at `at` (caller's clock): worker ordinal -> its sample."""
        with self._lock:
            self._observe(at, samples)

    def _observe(self, at: float, samples: Mapping[int, WorkerSample]) -> None:
        for ordinal, sample in samples.items():
            points = self._samples.setdefault(ordinal, [])
            if self.warmup_seconds > 0 and (not points or sample.processed < points[-1].processed):
                self._warm_from[ordinal] = at + self.warmup_seconds  # new, or restarted
            points.append(sample)
        for ordinal in list(self._samples):
            kept = [s for s in self._samples[ordinal] if at - s.at <= self.window_seconds]
            if ordinal not in samples and not kept:
                del self._samples[ordinal]  # a worker that stopped answering a whole window ago
                self._warm_from.pop(ordinal, None)
            else:
                self._samples[ordinal] = kept or self._samples[ordinal][-1:]
        self._lag.append((at, {s: x.records for s, x in merged_lag(samples.values()).items()}))
        self._lag = [p for p in self._lag if at - p[0] <= self.window_seconds] or self._lag[-1:]

    def load(self) -> Load | None:
        """Rates over the window, or None until some worker was scraped twice; a worker still warming
        up has no rates of its own (`Load.warming`), though its slots' input rates count."""
        with self._lock:
            return self._load()

    def _load(self) -> Load | None:
        workers: dict[int, WorkerLoad] = {}
        warming: set[int] = set()
        scraped_twice = False
        for ordinal, points in self._samples.items():
            scraped_twice = scraped_twice or len(points) > 1
            warm = [p for p in points if p.at >= self._warm_from.get(ordinal, 0.0)]
            if len(warm) < 2 or warm[-1].at <= warm[0].at:
                warming.add(ordinal)
                continue
            first, last = warm[0], warm[-1]
            seconds = last.at - first.at
            workers[ordinal] = WorkerLoad(
                _delta(last.processed, first.processed) / seconds,
                permits_busy=_delta(last.handler_seconds, first.handler_seconds) / seconds / self.concurrency,
                cpu_busy=_delta(last.cpu_seconds, first.cpu_seconds) / seconds,
            )
        if not scraped_twice:
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
        return Load(slot_rates, workers, frozenset(warming))

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
