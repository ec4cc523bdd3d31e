"""In-process totals of one worker, for the one-line summary and for tests.

Prometheus metrics (keyrange.metrics) are the contract for operators; these plain counters
exist because reading percentiles back out of a Prometheus histogram is coarse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_LATENCY_SAMPLES = 4096
"""Latencies kept between two summaries. Past this, every other kept one is dropped and from then
on only every 2nd (then 4th, ...) latency is kept: an even spread over the whole interval, whose
sort for the summary's percentiles runs on the event loop and must not stall every client's
events (BENCHMARKS.md, "The summary line's stall")."""


@dataclass
class WorkerStats:
    """Running totals and a sample of the latencies since they were last taken."""

    consumed: int = 0
    processed: int = 0
    """Events whose processed record has committed."""
    duplicates: int = 0
    dead_letters: int = 0
    pauses: int = 0
    """Times a slot was paused for backpressure."""
    pending: int = 0
    lag_records: int = 0
    lag_seconds: float = 0.0
    dedup_entries: int = 0
    latencies_s: list[float] = field(default_factory=list, repr=False)
    """Every `_latency_stride`-th latency since the last `take_latencies`."""
    _latency_stride: int = field(default=1, repr=False)
    _latency_skip: int = field(default=0, repr=False)
    """Latencies still to pass over before the next one kept."""

    def note_committed(self, processed: int, dead_letters: int, duplicates: int) -> None:
        """Count what one transaction committed (committer.py)."""
        self.processed += processed
        self.dead_letters += dead_letters
        self.duplicates += duplicates

    def note_latency(self, seconds: float) -> None:
        """Record one created -> handler start latency (in the sample: MAX_LATENCY_SAMPLES)."""
        if self._latency_skip:
            self._latency_skip -= 1
            return
        samples = self.latencies_s
        samples.append(seconds)
        self._latency_skip = self._latency_stride - 1
        if len(samples) >= MAX_LATENCY_SAMPLES:
            # Keeps the 1st, 3rd, ...: the next one kept, one old stride after the last one (dropped
            # now), is one new stride after the last one left.
            del samples[1::2]
            self._latency_stride *= 2

    def take_latencies(self) -> list[float]:
        """Return and forget the latencies sampled since the last call."""
        taken, self.latencies_s = self.latencies_s, []
        self._latency_stride, self._latency_skip = 1, 0
        return taken


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank; 0.0 when empty."""
    return percentiles(values, q)[0]


def percentiles(values: list[float], *qs: float) -> list[float]:
    """`percentile` of `values` for each of `qs`, sorting them once."""
    if not values:
        return [0.0 for _ in qs]
    ordered = sorted(values)
    # Nearest rank: the ceil(q * n)-th smallest. (round(q * n + 0.5) rounded half to even: the p99
    # of 100 values came out as their largest.)
    return [ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] for q in qs]
