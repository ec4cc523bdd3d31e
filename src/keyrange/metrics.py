"""Every `keyrange_*` Prometheus metric, declared once here and grouped by subject.

Names and labels are a contract (docs/design.md, alerts, dashboards). Labels are `consumer`,
`worker` and `partition` where relevant; never a client id (unbounded cardinality).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class LoopHistogram:
    """A Prometheus histogram for per-event observations from one thread (the worker's loop).

    prometheus_client's Histogram takes a lock per bucket and per sum on every observation, too
    much for the worker's per-event path (BENCHMARKS.md); this one is a bisect and two additions.
    It exposes the same `_bucket`/`_count`/`_sum` samples. Observe from one thread only; a scrape
    may see a count one observation ahead of the sum, never a decrease.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(sorted(buckets))
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}
        REGISTRY.register(self)

    def labels(self, *values: str) -> LoopHistogramChild:
        """The child for these label values (bind once, observe often)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = LoopHistogramChild(self.bounds)
        return child

    def describe(self) -> list[Metric]:
        """The family without samples (for the registry's duplicate-name check)."""
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        """Cumulative buckets, count and sum of every child."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        for values, child in list(self._children.items()):
            cumulative, running = [], 0
            for le, n in zip(les, list(child.counts), strict=True):
                running += n
                cumulative.append((le, float(running)))
            family.add_metric(list(values), cumulative, child.sum)
        yield family


class LoopHistogramChild:
    """One label combination of a LoopHistogram."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation (from the owning thread only)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


# --- Worker: events ------------------------------------------------------------------------
_WP = ("consumer", "worker", "partition")

EVENTS_CONSUMED = Counter(
    "keyrange_events_consumed", "Input records fetched by the worker (before dedup).", _WP
)
EVENTS_PROCESSED = Counter(
    "keyrange_events_processed", "Events whose handler returned and whose output was committed.", _WP
)
DUPLICATES_DROPPED = Counter(
    "keyrange_duplicates_dropped", "Events dropped because their uuid was seen within the TTL.", _WP
)
DEAD_LETTERS = Counter(
    "keyrange_dead_letters", "Records sent to the dead-letter topic (bad input or handler failures).",
    (*_WP, "reason"),
)
CLOCK_SKEWED_EVENTS = Counter(
    "keyrange_clock_skewed_events",
    "Events whose `created` was ahead of the worker's clock, or behind the partition's stream time, by more "
    "than the tolerated skew (direction: ahead | behind). The dedup window bounds their time either way.",
    (*_WP, "direction"),
)
MISPLACED_EVENTS = Counter(
    "keyrange_misplaced_events",
    "Events on a partition other than the one murmur2(clientId) picks: their client's order and state are "
    "split across partitions. Fix the producer's partitioner (Java's default, or librdkafka's murmur2_random).",
    _WP,
)

# --- Worker: queues, dedup, backpressure, lag ----------------------------------------------
DEDUP_ENTRIES = Gauge("keyrange_dedup_entries", "uuids remembered by the TTL dedup window.", _WP)
PENDING_EVENTS = Gauge(
    "keyrange_pending_events", "Fetched events of the partition not yet committable.", _WP
)
PARTITION_PAUSED = Gauge(
    "keyrange_partition_paused", "1 while the partition is paused for backpressure (max pending).", _WP
)
CONSUMER_LAG = Gauge(
    "keyrange_consumer_lag", "Records between the committable offset and the partition's high watermark "
    "(absent while that end is unknown).", _WP
)
CONSUMER_LAG_SECONDS = Gauge(
    "keyrange_consumer_lag_seconds", "Age of the oldest unfinished event of the partition (0 when none).", _WP
)

# --- Worker: latency -------------------------------------------------------------------------
# Fine buckets between 1 and 100 ms so that p50/p99 around the kata's 10-50 ms can be read.
_LATENCY_BUCKETS = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
EVENT_LATENCY = LoopHistogram(
    "keyrange_event_latency_seconds", "Time from the event's `created` to its handler's start.",
    ("consumer", "worker"), buckets=_LATENCY_BUCKETS,
)
HANDLER_TIMEOUTS = Counter(
    "keyrange_handler_timeouts", "Handler calls that did not return within handlerTimeoutSeconds.",
    ("consumer", "worker"),
)
HANDLER_CALLS_ABANDONED = Gauge(
    "keyrange_handler_calls_abandoned",
    "Sync handler calls that timed out and still hold a thread (Python cannot stop a thread).",
    ("consumer", "worker"),
)
HANDLER_CALL_ABANDONED_SECONDS = Gauge(
    "keyrange_handler_call_abandoned_seconds",
    "How long ago the oldest sync call still running timed out (0: none); it holds its client meanwhile.",
    ("consumer", "worker"),
)
HANDLER_SECONDS = LoopHistogram(
    "keyrange_handler_seconds", "Duration of one handler call (each attempt).",
    ("consumer", "worker"), buckets=_LATENCY_BUCKETS,
)

# --- Worker: handoffs -------------------------------------------------------------------------
# From a slot's publication in transit to its new owner's first event (ranges/pauses.py): tens of
# milliseconds after a read-ahead, seconds when a restore reads a long log.
HANDOFF_PAUSE = LoopHistogram(
    "keyrange_handoff_pause_seconds",
    "Pause of a moved slot: from the publication that put it in transit to the new owner's first event "
    "(or that event's creation, if later).",
    ("consumer", "worker"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)

# --- Worker: transactions ------------------------------------------------------------------
TRANSACTIONS = Counter(
    "keyrange_transactions", "Output transactions committed (outputs, state and offsets).", ("consumer", "worker")
)
HELD_SLOTS = Gauge("keyrange_held_slots", "Slots (partitions) the worker currently holds.", ("consumer", "worker"))
FETCH_STALLS = Counter(
    "keyrange_fetch_stalls", "Held partitions found fetching nothing with records waiting, and assigned again "
    "(worker/stalls.py).", ("consumer", "worker")
)

# --- Autoscaling: the alert webhook (operator and `keyrange run --webhook-port`) ---------------
# The operator's own series name a StreamConsumer's namespace `streamconsumer_namespace`, never
# `namespace`: the scrape sets `namespace` to the operator pod's, and Prometheus would rename ours
# to `exported_namespace`.
ALERT_VERDICTS = Counter(
    "keyrange_alert_verdicts",
    "Alerts received by the webhook, by verdict (scale, repeat, flapping, unknown-consumer, ...).", ("outcome",)
)
SCALE_REQUESTS = Counter(
    "keyrange_scale_requests", "Scale requests the alert webhook made to a controller, and whether applied.",
    ("streamconsumer_namespace", "consumer", "direction", "applied"),
)

# --- Operator: reconciliation and the worker pods it asks for ----------------------------------
OPERATOR_RECONCILES = Counter(
    "keyrange_operator_reconciles",
    "Reconciles of a StreamConsumer by the operator, by handler (reconcile, refresh) and result "
    "(ok, invalid, error).",
    ("handler", "result"),
)
OPERATOR_DESIRED_WORKERS = Gauge(
    "keyrange_operator_desired_workers", "Worker pods the operator wants for a StreamConsumer.",
    ("streamconsumer_namespace", "consumer"),
)
