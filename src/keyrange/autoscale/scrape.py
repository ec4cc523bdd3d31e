"""Reading the workers' /metrics: the local supervisor's lag source and the live table's figures.

The same `keyrange_*` metrics Prometheus scrapes in a cluster; locally the supervisor scrapes them
itself, once a second. Lag comes from the workers (`keyrange_consumer_lag`: see the worker
consumer's `high_watermarks`), so a slot that no worker holds right now has no measurement.
"""

from __future__ import annotations

import http.client
import re
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

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


WANTED_SAMPLES = frozenset({
    "keyrange_events_processed_total", "keyrange_handler_seconds_sum", "process_cpu_seconds_total",
    "keyrange_events_consumed_total", "keyrange_duplicates_dropped_total", "keyrange_dead_letters_total",
    "keyrange_consumer_lag", "keyrange_consumer_lag_seconds", "keyrange_event_latency_seconds_bucket",
})
"""The samples `parse_metrics` reads; `samples` skips the others' lines unparsed."""

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPED = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    return _ESCAPED.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value) if "\\" in value else value


def samples(text: str, wanted: frozenset[str] = WANTED_SAMPLES) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of a Prometheus text exposition whose name is in
    `wanted`. The supervisor reads every worker once a second; prometheus_client's parser, which
    parses every line a character at a time, cost it 15 times as much (BENCHMARKS.md, "Idle workers")."""
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace, space = line.find("{"), line.find(" ")
        try:
            if brace != -1 and (space == -1 or brace < space):
                if line[:brace] not in wanted:
                    continue
                end = line.rindex("}")
                labels = {k: _unescape(v) for k, v in _LABEL.findall(line, brace + 1, end)}
                yield line[:brace], labels, float(line[end + 1:].split()[0])
            elif space == -1:
                raise ValueError  # a name without a value
            elif line[:space] in wanted:
                yield line[:space], {}, float(line[space + 1:].split()[0])
        except (IndexError, ValueError):
            raise ValueError(f"not a sample line of the Prometheus text format: {line!r}") from None


def parse_metrics(text: str, at: float) -> WorkerSample:
    """Fold a Prometheus text exposition into a WorkerSample (sums over label sets)."""
    sample = WorkerSample(at)
    records: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for name, labels, value in samples(text):
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
