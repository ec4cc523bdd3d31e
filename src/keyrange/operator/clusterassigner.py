"""The real RangeControl in a cluster: keyrange's range Controller over the consumer's Kafka control topic.

One per StreamConsumer, run by the operator in a thread. The Controller's WorkerFleet is the
StatefulSet: `scale_to(n)` only records n, and the operator's refresh timer applies it as the
StatefulSet's replicas (`desired_workers`). The Controller itself waits for a new worker to
report on the control topic before publishing the epoch that gives it slots (split), and lowers
the count only after the freed worker released its slots (merge); so the operator needs no
handoff logic of its own.

Lag comes from the workers' /metrics, scraped through the headless Service's pod DNS names
(`<name>-worker-<i>.<name>-worker.<namespace>.svc`). A fixed `workers.replicas` (kubectl scale,
an HPA) becomes workers.min = workers.max for the planner, which then converges one ordinary
handoff at a time.

A controller that another controller of the same group fenced stands down: it does not claim the
role back, which would fence the other in turn, forever. Only the Lease holder runs controllers,
and a holder that lost the Lease stopped them before a successor could start (leadership.py), so
a fence means a different controller: a second operator release, or `keyrange run`, on the same
group. The status says so until the StreamConsumer changes or the operator restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaException

from keyrange.autoscale.load import WINDOW_SECONDS, LoadTracker
from keyrange.autoscale.scrape import WorkerSample, merged_lag, scrape
from keyrange.errors import UserError
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.kafkaquirks import LONGEST_RETRY_SECONDS, Backoff
from keyrange.operator.kafkasecrets import SecretReader, operator_client_properties, read_secret_key
from keyrange.operator.rangecontrol import HandoffSummary, PlannedRescale, RangeStatus, map_status
from keyrange.ranges.channel import ControlChannel, ControllerFenced, WorkerReport
from keyrange.ranges.controller import Controller
from keyrange.ranges.groupoffsets import GroupOffsetWriter
from keyrange.ranges.planner import Direction, ScaleOutcome, ScalingLimits, SlotLag
from keyrange.ranges.sizing import Load
from keyrange.spec import StreamConsumerSpec

log = logging.getLogger(__name__)


def planner_limits(spec: StreamConsumerSpec) -> ScalingLimits:
    """The spec's limits; a fixed `workers.replicas` pins both bounds to it."""
    limits = ScalingLimits.from_spec(spec)
    replicas = spec.workers.replicas
    if replicas is None:
        return limits
    return ScalingLimits(replicas, replicas, limits.lag_high_records, limits.lag_high_seconds,
                         limits.lag_low_records, limits.cooldown_seconds)


class StatefulSetFleet:
    """The Controller's WorkerFleet: remembers the worker count for the operator to apply."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def scale_to(self, workers: int) -> None:
        """Record the count; the operator's refresh timer patches the StatefulSet."""
        if workers != self.workers:
            log.info("worker count %d -> %d", self.workers, workers)
        self.workers = workers


class PodMetricsLag:
    """LagSource and LoadSource: per-slot lag and the load scraped from each worker pod's /metrics
    (at most every `every_seconds`)."""

    def __init__(self, url_of: Callable[[int], str], fleet: StatefulSetFleet, every_seconds: float = 2.0,
                 fetch: Callable[[str, float], WorkerSample | None] = scrape, concurrency: int = 64,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._url_of, self._fleet, self._every, self._fetch, self._clock = url_of, fleet, every_seconds, fetch, clock
        self._at = float("-inf")
        self._lag: Mapping[int, SlotLag] = {}
        self._load = LoadTracker(concurrency, window_seconds=max(WINDOW_SECONDS, 2 * every_seconds))

    def slot_lag(self) -> Mapping[int, SlotLag]:
        """The newest per-slot lag (pods that do not answer are skipped)."""
        now = self._clock()
        if now - self._at >= self._every:
            self._at = now
            samples = {i: s for i in range(self._fleet.workers) if (s := self._fetch(self._url_of(i), now))}
            self._lag = merged_lag(samples.values())
            self._load.observe(now, samples)
        return self._lag

    def load(self) -> Load | None:
        """The load over the last scrapes (read right after `slot_lag`)."""
        return self._load.load()


def newest_handoff(reports: list[WorkerReport]) -> HandoffSummary | None:
    """The newest grant's pause over the workers that reported one (the largest, if several did)."""
    pauses = [(r.pause.epoch, r.pause.pause_ms, r.worker, r.pause.at_ms) for r in reports if r.pause is not None]
    if not pauses:
        return None
    epoch, pause_ms, worker, at_ms = max(pauses)
    return HandoffSummary(epoch, pause_ms / 1000, worker, at_ms)


class KafkaRangeControl:
    """RangeControl backed by keyrange.ranges.controller.Controller (see the module docstring)."""

    def __init__(self, namespace: str, name: str, spec: StreamConsumerSpec, metrics_port: int = 9100,
                 step_seconds: float = 0.5, retry_seconds: float = 5.0,
                 read_secret: SecretReader = read_secret_key,
                 connect: Callable[[], Controller] | None = None) -> None:
        self._namespace, self._name, self._spec = namespace, name, spec
        self._connect_controller = connect or self._connect
        """Makes and starts the Controller (tests pass a stand-in for the Kafka one)."""
        self._read_secret = read_secret
        self._fleet = StatefulSetFleet(spec.workers.replicas or spec.workers.min)
        service = f"{name}-worker.{namespace}.svc"
        self._lag = PodMetricsLag(lambda i: f"http://{name}-worker-{i}.{service}:{metrics_port}/metrics",
                                  self._fleet, concurrency=spec.concurrency)
        self._step_seconds, self._retry_seconds = step_seconds, retry_seconds
        self._connecting = Backoff(retry_seconds, max(retry_seconds, LONGEST_RETRY_SECONDS))
        """Waits between tries to connect while Kafka is away or the spec is wrong."""
        self._controller: Controller | None = None
        self._decisions_taken: tuple[Controller | None, int] = (None, 0)
        """(controller, how many of its rescales take_decisions has looked at)."""
        self._problem: str | None = None
        self._stop = threading.Event()
        self._stepped_last = threading.Event()
        """Set once the thread has left its loop: no step (so no publication) follows."""
        self._reconnect = threading.Event()
        self._fenced: ControllerFenced | None = None
        """Set when another controller of the group fenced this one: it stands down (module docstring)."""
        self._thread = threading.Thread(target=self._run, name=f"keyrange-controller-{namespace}-{name}",
                                        daemon=True)
        self._thread.start()

    def _identity(self, spec: StreamConsumerSpec) -> tuple[object, ...]:
        kafka = spec.kafka
        return (kafka.bootstrap_servers, kafka.topic, spec.group_id(self._name, self._namespace),
                kafka.replication_factor, sorted(kafka.client_properties.items()),
                [i.model_dump() for i in kafka.client_properties_from])

    def _connect(self) -> Controller:
        spec = self._spec
        bootstrap = spec.kafka.bootstrap_servers
        if not bootstrap:
            raise ValueError("spec.kafka.bootstrapServers is empty")
        properties = operator_client_properties(self._namespace, spec, self._read_secret)
        replication = spec.kafka.replication_factor
        counts = ensure_topics(bootstrap, [TopicSpec(spec.kafka.topic, spec.kafka.partitions)],
                               client_properties=properties, replication_factor=replication)
        group = spec.group_id(self._name, self._namespace)
        ControlChannel.ensure_topic(bootstrap, group, properties, replication)
        channel = ControlChannel(bootstrap, group, f"keyrange-operator-{self._name}", properties)
        offsets = GroupOffsetWriter(bootstrap, group, spec.kafka.topic, properties)
        controller = Controller(channel, counts[spec.kafka.topic], planner_limits(spec), self._lag, self._fleet,
                                group_offsets=offsets)
        controller.start()
        return controller

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._fenced is not None and not self._reconnect.is_set():
                self._disconnect()
                self._stop.wait(self._retry_seconds)  # standing down until the spec changes
                continue
            if self._controller is None or self._reconnect.is_set():
                self._reconnect.clear()
                self._fenced = None
                self._disconnect()
                try:
                    self._controller = self._connect_controller()
                    self._problem = None
                    self._connecting.succeeded()
                except (KafkaException, UserError, ValueError, OSError) as exc:  # Kafka down or misconfigured
                    self._problem = f"cannot run the range controller: {exc}"
                    delay = self._connecting.failed()
                    log.warning("%s/%s: %s; retrying in %.0f s", self._namespace, self._name, self._problem, delay)
                    self._stop.wait(delay)
                    continue
            try:
                self._controller.step_and_wait(self._stop, self._step_seconds)
            except ControllerFenced as exc:
                self._stand_down(exc)
            except Exception:
                log.exception("%s/%s: controller step failed; retrying", self._namespace, self._name)
                self._stop.wait(self._retry_seconds)
        self._stepped_last.set()
        self._disconnect()

    def _stand_down(self, exc: ControllerFenced) -> None:
        if self._fenced is not None:
            return
        group = self._spec.group_id(self._name, self._namespace)
        self._problem = (
            f"stood down as range controller of consumer group {group!r}: another controller claimed it ({exc}). "
            "Two controllers on one group (a second keyrange operator release, or `keyrange run`) would fence each "
            "other forever: stop the other one, then change this StreamConsumer or restart the operator")
        log.error("%s/%s: %s", self._namespace, self._name, self._problem)
        self._fenced = exc

    def _disconnect(self) -> None:
        controller, self._controller = self._controller, None
        if controller is not None:
            controller.close()

    def desired_workers(self) -> int:
        """What the Controller's fleet was last told."""
        return self._fleet.workers

    def workers_available(self, ready: int) -> None:
        """Unused: the Controller learns that a worker runs from its report on the control topic."""

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        """Split or merge now (within limits and cooldown), through the Controller."""
        controller = self._controller
        n = self._fleet.workers
        if controller is None or self._fenced is not None:
            return ScaleOutcome(False, self._problem or "the range controller is still starting", n, n)
        try:
            return controller.request_scale(direction, reason)
        except ControllerFenced as exc:
            self._stand_down(exc)
            return ScaleOutcome(False, self._problem or str(exc), n, n)

    def update_spec(self, spec: StreamConsumerSpec) -> None:
        """New limits apply at the next step; a new broker, topic, group or client properties reconnects."""
        old, self._spec = self._spec, spec
        if self._identity(old) != self._identity(spec) or self._fenced is not None:
            self._reconnect.set()  # a controller that stood down takes the role again on a change
        elif self._controller is not None:
            self._controller.planner.limits = planner_limits(spec)

    def status(self) -> RangeStatus:
        """Epoch, map, lag and whether a handoff is in flight."""
        controller = self._controller
        if controller is None or self._fenced is not None:
            return RangeStatus(epoch=0, workers=self._fleet.workers, problem=self._problem)
        s = controller.status()
        lags = s.range_lag
        return RangeStatus(
            **map_status(s.map, s.layout),
            lag_records=sum(x.records for x in lags) if lags else None,
            lag_seconds=max((x.seconds for x in lags), default=None),
            handoff_in_progress=bool(s.handoff_awaiting) or s.starting,
            last_handoff=newest_handoff(list(controller.channel.state.reports.values())))

    def take_decisions(self) -> list[PlannedRescale]:
        """The planner's own rescales since the last call (a reconnect starts a new Controller, whose
        list starts empty)."""
        controller = self._controller
        if controller is None:
            return []
        seen_controller, seen = self._decisions_taken
        if seen_controller is not controller:
            seen = 0
        rescales = list(controller.rescales)
        self._decisions_taken = (controller, len(rescales))
        return [PlannedRescale(r.workers_before, r.workers_after, r.reason, r.decided_ms)
                for r in rescales[seen:] if not r.requested]

    def close(self) -> None:
        """Stop the controller thread, waiting for its step in flight but not for its Kafka clients,
        which it closes on its way out: a leader that lost its Lease must stop acting before a
        standby's lease wait ends, and closing clients on a busy machine takes seconds.

        Waits only briefly: a step blocked on an unreachable Kafka must not hold up the deletion
        of the StreamConsumer (kopf's delete handler calls this); the controller's transactional
        id fences such a step's writes once another controller starts.
        """
        self._stop.set()
        self._stepped_last.wait(timeout=2)
