"""In-process totals of one worker, for the one-line summary and for tests.

Prometheus metrics (keyrange.metrics) are the contract for operators; these plain counters
exist because reading percentiles back out of a Prometheus histogram is coarse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LATENCY_SAMPLES = 200_000
"""Latencies kept between two summaries; beyond this, later samples are not kept."""


@dataclass
class WorkerStats:
    """Running totals and the latencies since they were last taken."""

    consumed: int = 0
    processed: int = 0
    """Events whose processed record has committed."""
    duplicates: int = 0
    dead_letters: int = 0
    pauses: int = 0
    """Times a partition was paused for backpressure."""
    pending: int = 0
    lag_records: int = 0
    lag_seconds: float = 0.0
    dedup_entries: int = 0
    latencies_s: list[float] = field(default_factory=list, repr=False)

    def note_latency(self, seconds: float) -> None:
        """Record one created -> handler start latency."""
        if len(self.latencies_s) < MAX_LATENCY_SAMPLES:
            self.latencies_s.append(seconds)

    def take_latencies(self) -> list[float]:
        """Return and forget the latencies recorded since the last call."""
        taken, self.latencies_s = self.latencies_s, []
        return taken


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[index]
