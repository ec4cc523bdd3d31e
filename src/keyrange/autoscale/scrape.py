"""Reading the workers' /metrics: the local supervisor's lag source and the live table's figures.

The same `keyrange_*` metrics Prometheus scrapes in a cluster; locally the supervisor scrapes them
itself, once a second. Lag comes from the workers (`keyrange_consumer_lag`: see the worker
consumer's `high_watermarks`), so a slot that no worker holds right now has no measurement.
"""

from __future__ import annotations

import http.client
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from keyrange.ranges.layout import slot_of_label
from keyrange.ranges.planner import SlotLag


@dataclass
class WorkerSample:
    """One scrape of one worker."""

    at: float
    """Caller's clock (seconds) at the scrape."""
    processed: float = 0.0
    consumed: float = 0.0
    duplicates: float = 0.0
    dead_letters: float = 0.0
    slot_lag: dict[int, SlotLag] = field(default_factory=dict)
    latency_buckets: dict[float, float] = field(default_factory=dict)
    """Cumulative `keyrange_event_latency_seconds` bucket counts by upper bound (`le`)."""
    slot_processed: dict[int, float] = field(default_factory=dict)
    """`keyrange_events_processed_total` per partition (slot)."""
    handler_seconds: float = 0.0
    """`keyrange_handler_seconds_sum`: seconds spent in handler calls."""
    cpu_seconds: float = 0.0
    """`process_cpu_seconds_total` of the worker process."""


def parse_metrics(text: str, at: float) -> WorkerSample:
    """Fold a Prometheus text exposition into a WorkerSample (sums over label sets)."""
    sample = WorkerSample(at)
    records: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name, labels, value = s.name, s.labels, float(s.value)
            if name == "keyrange_events_processed_total":
                sample.processed += value
                if "partition" in labels:
                    slot = slot_of_label(labels["partition"])
                    sample.slot_processed[slot] = sample.slot_processed.get(slot, 0.0) + value
            elif name == "keyrange_handler_seconds_sum":
                sample.handler_seconds += value
            elif name == "process_cpu_seconds_total":
                sample.cpu_seconds += value
            elif name == "keyrange_events_consumed_total":
                sample.consumed += value
            elif name == "keyrange_duplicates_dropped_total":
                sample.duplicates += value
            elif name == "keyrange_dead_letters_total":
                sample.dead_letters += value
            elif name == "keyrange_consumer_lag" and "partition" in labels:
                records[slot_of_label(labels["partition"])] = int(value)
            elif name == "keyrange_consumer_lag_seconds" and "partition" in labels:
                seconds[slot_of_label(labels["partition"])] = value
            elif name == "keyrange_event_latency_seconds_bucket":
                le = float(labels["le"])
                sample.latency_buckets[le] = sample.latency_buckets.get(le, 0.0) + value
    for slot, behind in records.items():  # no lag in records: unmeasured, whatever its age says
        sample.slot_lag[slot] = SlotLag(behind, seconds.get(slot, 0.0))
    return sample


def scrape(url: str, at: float, timeout_seconds: float = 1.0) -> WorkerSample | None:
    """Scrape one /metrics URL; None when the worker does not answer (starting, restarting, or
    killed mid-answer: a body cut short raises http.client.IncompleteRead, not an OSError)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as response:
            return parse_metrics(response.read().decode("utf-8"), at)
    except (OSError, ValueError, http.client.HTTPException):
        return None


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile of a cumulative histogram (as Prometheus' histogram_quantile); None if empty."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            width = count - prev_count
            fraction = (rank - prev_count) / width if width > 0 else 1.0
            return prev_bound + (bound - prev_bound) * fraction
        prev_bound, prev_count = bound, count
    return prev_bound


def bucket_delta(newer: Mapping[float, float], older: Mapping[float, float]) -> dict[float, float]:
    """Bucket counts observed between two scrapes (a counter reset counts from zero)."""
    out = {}
    for le, count in newer.items():
        before = older.get(le, 0.0)
        out[le] = count - before if count >= before else count
    return out


def merged_lag(samples: Iterable[WorkerSample]) -> dict[int, SlotLag]:
    """Per-slot lag over workers (a slot reported twice, mid-handoff, keeps the larger)."""
    out: dict[int, SlotLag] = {}
    for sample in samples:
        for slot, lag in sample.slot_lag.items():
            old = out.get(slot)
            if old is None or lag.records > old.records:
                out[slot] = lag
    return out
