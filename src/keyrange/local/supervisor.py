"""The local supervisor behind `keyrange run`: one StreamConsumer on this machine.

It starts an embedded broker when no bootstrap servers are given (`broker_choice`: Apache Kafka
where Java is installed, else tansu), creates the topics, runs the range controller in a thread
(the same `Controller` the operator runs), runs the workers as subprocesses in controlled mode
(`ProcessFleet`), restarts a crashed one, scrapes their /metrics for lag and the live table, and
keeps a history for the demo's report. `stop` SIGTERMs the workers (they finish in-flight events
and commit) and then stops the broker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from keyrange.autoscale.load import LoadTracker
from keyrange.autoscale.scrape import WorkerSample, bucket_delta, histogram_quantile, merged_lag, scrape
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.local.broker_choice import LocalBroker, choose_broker
from keyrange.local.fleet import ProcessFleet
from keyrange.local.monitoring import AlertingOptions, LocalAlertPath, without_lag_thresholds
from keyrange.local.table import Totals, WorkerRow, render, row_lag
from keyrange.ranges.channel import ControlChannel, now_ms
from keyrange.ranges.controller import Controller, ControllerStatus
from keyrange.ranges.groupoffsets import GroupOffsetWriter
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.planner import Direction, ScaleOutcome, ScalingLimits, SlotLag
from keyrange.ranges.sizing import Load
from keyrange.ranges.slots import format_slot_list
from keyrange.spec import StreamConsumer

log = logging.getLogger(__name__)

RATE_WINDOW_SECONDS = 5.0
"""Rates and the p99 latency are computed over this trailing window."""


@dataclass(frozen=True)
class HistoryPoint:
    """One tick of the run, for the demo's plot and report."""

    at_ms: int
    rate: float
    lag_records: int
    lag_seconds: float
    p99_latency_seconds: float | None
    workers: int
    epoch: int
    processed: int
    duplicates: int


@dataclass
class _Counters:
    """Totals summed from per-worker deltas, so restarts and retired workers do not lose counts."""

    processed: float = 0.0
    duplicates: float = 0.0
    dead_letters: float = 0.0
    last: dict[int, WorkerSample] = field(default_factory=dict)

    def add(self, ordinal: int, sample: WorkerSample) -> None:
        prev = self.last.get(ordinal)
        for name in ("processed", "duplicates", "dead_letters"):
            new, old = getattr(sample, name), getattr(prev, name) if prev else 0.0
            setattr(self, name, getattr(self, name) + (new - old if new >= old else new))
        self.last[ordinal] = sample


def default_run_dir(name: str) -> Path:
    """Where `keyrange run` keeps a consumer's worker logs and configs without --run-dir."""
    return Path(".keyrange") / name


class Supervisor:
    """Runs one StreamConsumer locally (see the module docstring)."""

    def __init__(self, consumer: StreamConsumer, spec_file: Path, bootstrap: str | None = None,
                 run_dir: Path | None = None, worker_args: tuple[str, ...] = (), tick_seconds: float = 1.0,
                 alerting: AlertingOptions | None = None, spare_workers: int = 1,
                 broker: LocalBroker | None = None) -> None:
        self.consumer = consumer
        self.spec_file = spec_file
        self.bootstrap = bootstrap or consumer.spec.kafka.bootstrap_servers
        self.run_dir = run_dir or default_run_dir(consumer.name)
        self.worker_args = worker_args
        self.tick_seconds = tick_seconds
        self.spare_workers = spare_workers
        """Standby worker processes kept running so a split need not wait for one to start."""
        self.client_properties: dict[str, str] = {}
        """The spec's Kafka client properties, secrets read from the environment (at `start`)."""
        self._embedded = broker
        """The broker to start when neither `bootstrap` nor the spec gives one (default: the
        `choose_broker` default's, without its notice)."""
        self.broker: LocalBroker | None = None
        """The broker `start` started, if any."""
        self.controller: Controller | None = None
        self.fleet: ProcessFleet | None = None
        self.history: list[HistoryPoint] = []
        self.started = time.monotonic()
        self._samples: dict[int, WorkerSample] = {}
        self._load = LoadTracker(consumer.spec.concurrency)
        self._window: list[tuple[float, float, dict[int, dict[float, float]]]] = []
        """(time, processed total, latency buckets per worker) over the trailing window."""
        self._counters = _Counters()
        self._worker_window: dict[int, list[tuple[float, float]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.alerts = LocalAlertPath(alerting, consumer, self.run_dir) if alerting else None
        """The alert path (`--webhook-port`): Alertmanager decides instead of the planner's lag triggers."""

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Broker (if needed), topics, controller thread, first workers."""
        if not self.bootstrap:
            self.broker = self._embedded or choose_broker(None).broker()
            self.bootstrap = self.broker.start()
            log.info("embedded broker at %s", self.bootstrap)
        spec = self.consumer.spec
        group = self.consumer.group_id
        # The workers read the same variables: they inherit this process's environment.
        self.client_properties = spec.kafka.resolved_client_properties(os.environ)
        counts = ensure_topics(self.bootstrap, [TopicSpec(spec.kafka.topic, spec.kafka.partitions)],
                               client_properties=self.client_properties,
                               replication_factor=spec.kafka.replication_factor)
        ControlChannel.ensure_topic(self.bootstrap, group, self.client_properties, spec.kafka.replication_factor)
        slot_count = SlotLayout.for_workers(counts[spec.kafka.topic], spec.workers.max).slot_count
        self.fleet = ProcessFleet(self.spec_file, self.bootstrap, self.run_dir / "logs", self.worker_args,
                                  max_workers=min(spec.workers.max, slot_count), spare=self.spare_workers)
        channel = ControlChannel(self.bootstrap, group, "keyrange-run", self.client_properties)
        limits = ScalingLimits.from_spec(spec)
        if self.alerts is not None:
            limits = without_lag_thresholds(limits)
        offsets = GroupOffsetWriter(self.bootstrap, group, spec.kafka.topic, self.client_properties)
        self.controller = Controller(channel, counts[spec.kafka.topic], limits, self, self.fleet,
                                     group_offsets=offsets)
        self.controller.start()
        if self.alerts is not None:
            self.alerts.start(self)
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self.controller.run, args=(self._stop,), name="keyrange-controller",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop planning, SIGTERM the workers (they commit), stop the broker we started. Each step
        runs even if an earlier one failed, and the last failure is raised: a worker that would not
        stop must not leave the embedded broker running."""
        self._stop.set()
        with contextlib.ExitStack() as steps:  # its callbacks run last-pushed first, every one of them
            if self.broker is not None:
                steps.callback(self.broker.stop)
            if self.controller is not None:
                steps.callback(self.controller.close)
            if self.fleet is not None:
                steps.callback(self.fleet.stop)
            if self._thread is not None:
                steps.callback(self._thread.join, 10)
            if self.alerts is not None:
                steps.callback(self.alerts.stop)

    # --- the controller's hooks --------------------------------------------------------------

    def slot_lag(self) -> Mapping[int, SlotLag]:
        """LagSource for the controller: the newest scrape of every worker."""
        return merged_lag(self._samples.values())

    def load(self) -> Load | None:
        """LoadSource for the controller: rates and busy fractions over the last scrapes."""
        return self._load.load()

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        """One split or merge now (the alert webhook's entry point), within limits and cooldown."""
        assert self.controller is not None, "supervisor not started"
        return self.controller.request_scale(direction, reason)

    # --- ticking -----------------------------------------------------------------------------

    def tick(self) -> HistoryPoint:
        """Restart dead workers, scrape every worker, record a history point."""
        assert self.fleet is not None and self.controller is not None
        if self.controller.stopped_by is not None:
            raise self.controller.stopped_by  # another controller took this consumer over
        self.fleet.check()
        now = time.monotonic()
        samples: dict[int, WorkerSample] = {}
        for ordinal, url in self.fleet.urls().items():
            sample = scrape(url, now)
            if sample is not None:
                samples[ordinal] = sample
                self._counters.add(ordinal, sample)
                points = self._worker_window.setdefault(ordinal, [])
                points.append((now, sample.processed))
                while len(points) > 2 and now - points[0][0] > RATE_WINDOW_SECONDS:
                    points.pop(0)
        self._samples = samples
        self._load.observe(now, samples)
        if self.alerts is not None:
            self.alerts.update_targets(self.fleet.urls())
        buckets = {o: dict(sample.latency_buckets) for o, sample in samples.items()}
        self._window.append((now, self._counters.processed, buckets))
        while len(self._window) > 2 and now - self._window[0][0] > RATE_WINDOW_SECONDS:
            self._window.pop(0)
        status = self.controller.status()
        lag = self.slot_lag()
        point = HistoryPoint(
            now_ms(), self._rate(), sum(x.records for x in lag.values()),
            max((x.seconds for x in lag.values()), default=0.0), self._p99(), status.map.workers, status.epoch,
            int(self._counters.processed), int(self._counters.duplicates),
        )
        self.history.append(point)
        return point

    def _rate(self) -> float:
        if len(self._window) < 2:
            return 0.0
        (t0, p0, _), (t1, p1, _) = self._window[0], self._window[-1]
        return (p1 - p0) / (t1 - t0) if t1 > t0 else 0.0

    def _p99(self) -> float | None:
        if len(self._window) < 2:
            return None
        first, last = self._window[0][2], self._window[-1][2]
        # Per worker, so a worker that stops (merge) or restarts does not distort the window.
        total: dict[float, float] = {}
        for ordinal, buckets in last.items():
            for le, count in bucket_delta(buckets, first.get(ordinal, {})).items():
                total[le] = total.get(le, 0.0) + count
        return histogram_quantile(0.99, total)

    def status(self) -> ControllerStatus:
        """The controller's status."""
        assert self.controller is not None, "supervisor not started"
        return self.controller.status()

    def table(self) -> str:
        """The live table as text."""
        assert self.fleet is not None and self.controller is not None
        status = self.controller.status()
        reports = self.controller.channel.state.reports
        rows = []
        for ordinal, w in sorted(self.fleet.workers.items()):
            sample = self._samples.get(ordinal)
            lag = row_lag(status.map.slots_of(ordinal), sample.slot_lag if sample is not None else None)
            report = reports.get(ordinal)
            held = ""
            if report and report.held:
                layout = status.layout
                held = layout.describe_slots(report.held) if layout else format_slot_list(sorted(report.held))
            rows.append(WorkerRow(ordinal, w.alive(), held, self._worker_rate(ordinal), lag, w.restarts))
        measured = self.slot_lag()
        unmeasured = sum(1 for s in range(status.map.slot_count) if s not in measured)
        totals = Totals(time.monotonic() - self.started, int(self._counters.processed), self._rate(), self._p99(),
                        int(self._counters.duplicates), int(self._counters.dead_letters), unmeasured)
        return render(self.consumer.name, status, rows, totals, now_ms())

    def _worker_rate(self, ordinal: int) -> float:
        points = self._worker_window.get(ordinal, [])
        if len(points) < 2 or points[-1][0] <= points[0][0]:
            return 0.0
        return max(0.0, (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]))
