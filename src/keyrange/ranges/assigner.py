"""The controller: the single writer of assignments for one consumer.

It runs in the local supervisor (`keyrange run`) and in the Kubernetes operator alike. It is
given the bootstrap servers, the group, the slot count, the scaling limits, a lag source and a
fleet (who starts and stops worker processes or pods); it measures lag, asks the pure planner,
and drives the two-phase handoff over the control topic (see `channel.py`):

    decide -> fleet.scale_to(max(old, new)) -> announce the moves (prepare record)
           -> [split: the new worker reports it runs] -> the new owners report the moved slots
              read ahead (or `warm_timeout_seconds` pass)
           -> publish epoch E (moved slots in transit)
           -> every old owner reports E without them -> publish E+1 (nothing in transit)
           -> fleet.scale_to(new)

A split adds the worker before publishing the epoch that uses it; a merge removes the freed
(top) worker only after its handoff completed. One rescale at a time: no decision is taken while
a handoff is in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from keyrange.errors import UserError
from keyrange.ranges.channel import ControlChannel, ControllerFenced, Prepare, Publication, describe_reports, now_ms
from keyrange.ranges.ownership import grant, plan_handoff
from keyrange.ranges.planner import Decision, Direction, Planner, ScalingLimits, SlotLag, range_lag, with_epoch
from keyrange.ranges.rangemap import RangeMap
from keyrange.ranges.sizing import LoadSource

log = logging.getLogger(__name__)

WAKE_CHECK_SECONDS = 0.05
"""How often an idle wait checks its stop event (a `request_scale` wakes it at once)."""


class LagSource(Protocol):
    """Per-slot lag as measured now (worker metrics, Prometheus, or Kafka offsets)."""

    def slot_lag(self) -> Mapping[int, SlotLag]:
        """Lag of every slot that has a measurement."""
        ...


class WorkerFleet(Protocol):
    """Whatever runs the workers: local subprocesses or a StatefulSet."""

    def scale_to(self, workers: int) -> None:
        """Make workers 0..workers-1 run (start missing ones, stop those above)."""
        ...


@dataclass
class Rescale:
    """One rescale, from decision to completed handoff."""

    action: str
    reason: str
    epoch: int
    """The epoch that moved the slots (the grant is epoch + 1)."""
    workers_before: int
    workers_after: int
    moved_slots: frozenset[int]
    decided_ms: int
    """Wall-clock time of the decision (epoch ms)."""
    published_ms: int
    """Wall-clock time the epoch was published (after a new worker started, for a split)."""
    settled_ms: int | None = None
    """Wall-clock time the new owners were allowed to acquire."""
    requested: str = ""
    """The reason given to `request_scale` (an alert's name); empty when the planner decided alone."""


@dataclass(frozen=True)
class ControllerStatus:
    """What the controller reports (the table, the operator's status, the demo's report)."""

    epoch: int
    map: RangeMap
    range_lag: tuple[SlotLag, ...]
    """Lag per range, in map order."""
    handoff_awaiting: frozenset[int]
    """Workers whose release the current handoff waits for (empty when settled)."""
    starting: bool
    """True while a split waits for its new worker to start."""
    last_decision: str
    rescales: tuple[Rescale, ...] = field(default=())


@dataclass(frozen=True)
class ScaleResult:
    """What `request_scale` did."""

    applied: bool
    """True when a split or merge started."""
    detail: str
    """The planner's reason, or why nothing happened (cooldown, limits, a rescale in progress)."""
    from_workers: int
    to_workers: int


class Controller:
    """Plans and publishes range maps for one consumer (see the module docstring)."""

    def __init__(self, channel: ControlChannel, slot_count: int, limits: ScalingLimits, lag_source: LagSource,
                 fleet: WorkerFleet | None = None, clock: Callable[[], float] = time.monotonic,
                 start_timeout_seconds: float = 60.0, warm_timeout_seconds: float = 10.0) -> None:
        self.channel = channel
        self.slot_count = slot_count
        self.planner = Planner(limits)
        self.lag_source = lag_source
        self.fleet = fleet
        self.clock = clock
        self.rescales: list[Rescale] = []
        self.last_decision = "starting"
        self.start_timeout_seconds = start_timeout_seconds
        self.warm_timeout_seconds = warm_timeout_seconds
        """How long a handoff waits for its new owners to read ahead, counted from when they run (a
        split's new worker may take longer than this to start); after that it goes on, and their
        acquire finishes the read-ahead (or restores in full if it failed)."""
        self._pending: tuple[Decision, int, str] | None = None
        """(decision, decided_ms, the request's reason or "") until its epoch is published."""
        self._running_ms: int | None = None
        """When the pending rescale's new workers were first seen running (or stopped being waited
        for): its read-ahead wait counts from then, so a worker slow to start still gets it."""
        self._lock = threading.RLock()
        self._lag: Mapping[int, SlotLag] = {}
        self._stuck_logged_at = 0.0
        self._wake = threading.Event()
        self.stopped_by: ControllerFenced | None = None
        """Set when another controller of the group took over and this one stopped (see `run`)."""

    @property
    def publication(self) -> Publication:
        """The newest publication (after `start`)."""
        pub = self.channel.state.publication
        assert pub is not None, "Controller.start() was not called"
        return pub

    def start(self) -> Publication:
        """Claim the group's controller role (fencing any other controller at the broker), then
        resume from the control topic, or publish the first map (workers.min even ranges)."""
        self.channel.claim_writer()
        self.channel.catch_up()
        pub = self.channel.state.publication
        if pub is not None and pub.map.slot_count != self.slot_count:
            raise UserError(
                f"the control topic {self.channel.topic} maps {pub.map.slot_count} slots but the input topic has "
                f"{self.slot_count} partitions; delete the control topic (and the consumer's committed offsets) "
                "after changing the partition count"
            )
        if pub is None:
            first = RangeMap.even(self.slot_count, min(self.planner.limits.min_workers, self.slot_count))
            pub = Publication(first, reason="initial map", published_ms=now_ms())
            self.channel.publish(pub)
            self.channel.state.publication = pub
            log.info("published %s (initial)", first.describe())
        if self.fleet is not None:
            self.fleet.scale_to(max(pub.map.workers, max(pub.awaiting, default=-1) + 1))
        return pub

    def request_scale(self, direction: Direction, reason: str) -> ScaleResult:
        """Split ("up") or merge ("down") once now, skipping the lag thresholds but not the limits or
        the cooldown (the alert webhook calls this). Thread-safe; returns what happened."""
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        with self._lock:
            self.channel.poll(0.0)
            pub = self.publication
            before = pub.map.workers
            if pub.transit or self._pending is not None:
                return ScaleResult(False, f"a rescale is in progress ({pub.map.describe()})", before, before)
            decision = self.planner.decide(pub.map, self._lag, self.clock(), direction)
            log.info("scale %s requested (%s): %s", direction, reason, decision.reason)
            self.last_decision = decision.reason
            if decision.next_map is None:
                return ScaleResult(False, decision.reason, before, before)
            self._begin(pub, decision, reason)
            self._wake.set()  # the run loop follows the handoff from now on, not at its next idle tick
            return ScaleResult(True, decision.reason, before, decision.next_map.workers)

    def step(self) -> Publication:
        """Read the control topic, advance a pending rescale or plan the next one; return the newest
        publication. Thread-safe."""
        with self._lock:
            self.channel.poll(0.0)
            pub = self.publication
            if pub.transit:
                return self._advance_handoff(pub)
            if self._pending is not None:
                return self._publish_when_ready(pub)
            self._lag = self.lag_source.slot_lag()
            load = self.lag_source.load() if isinstance(self.lag_source, LoadSource) else None
            decision = self.planner.decide(pub.map, self._lag, self.clock(), load=load)
            self.last_decision = decision.reason
            if decision.next_map is None:
                return pub
            return self._begin(pub, decision)

    def _begin(self, pub: Publication, decision: Decision, requested: str = "") -> Publication:
        assert decision.next_map is not None
        self._pending = (decision, now_ms(), requested)
        prepare = Prepare(pub.epoch, plan_handoff(pub.map, decision.next_map).moves, now_ms())
        self.channel.announce(prepare)
        self.channel.state.prepare = prepare
        if self.fleet is not None:
            self.fleet.scale_to(max(pub.map.workers, decision.next_map.workers))
        return self._publish_when_ready(pub)

    def _publish_when_ready(self, pub: Publication) -> Publication:
        assert self._pending is not None
        decision, decided_ms, requested = self._pending
        assert decision.next_map is not None
        new_workers = range(pub.map.workers, decision.next_map.workers)
        # A split waits until the new worker runs (it reported after the decision), so the moved
        # slots keep flowing at their old owner while the new process starts.
        # A report from just before the decision counts too: a standby worker heartbeats every second.
        fresh_ms = decided_ms - 2 * 1000
        waiting = [w for w in new_workers if (r := self.channel.state.reports.get(w)) is None or r.at_ms < fresh_ms]
        if waiting and now_ms() - decided_ms < self.start_timeout_seconds * 1000:
            return pub
        if waiting:
            log.warning("worker(s) %s did not report within %.0f s; publishing anyway", waiting,
                        self.start_timeout_seconds)
        if self._running_ms is None:
            self._running_ms = now_ms()
        # The moved slots keep flowing at their old owners while the new ones read ahead, so the
        # pause after the release is only the catch-up on what was appended since.
        prepare = self.channel.state.prepare
        moves = prepare.moves if prepare is not None and prepare.epoch == pub.epoch else {}
        cold = [w for w, slots in moves.items() if not self.channel.state.warm(w, pub.epoch, slots)]
        if cold and now_ms() - self._running_ms < self.warm_timeout_seconds * 1000:
            return pub
        if cold:
            log.warning("worker(s) %s did not read ahead within %.0f s; handing over anyway (their acquire "
                        "finishes the read-ahead, or restores in full if it failed)", cold, self.warm_timeout_seconds)
        new_map = with_epoch(decision.next_map, pub.epoch + 1)
        handoff = plan_handoff(pub.map, new_map)
        moved, awaiting = handoff.moved, handoff.awaiting
        nxt = Publication(new_map, moved, awaiting, decision.reason, now_ms())
        self.channel.publish(nxt)
        # The rescale stays pending until its publication is the current one, so a status read
        # in between never sees "nothing in progress" (and a failed publish is retried).
        self.channel.state.publication = nxt
        self._pending = self._running_ms = None
        self.rescales.append(Rescale(decision.action, decision.reason, new_map.epoch, pub.map.workers,
                                     new_map.workers, moved, decided_ms, nxt.published_ms, requested=requested))
        log.info("published %s: %s; waiting for w%s to release %d slots", new_map.describe(), decision.reason,
                 ",w".join(map(str, sorted(awaiting))), len(moved))
        return self._advance_handoff(nxt)

    def _advance_handoff(self, pub: Publication) -> Publication:
        state = self.channel.state
        if not all(state.released(w, pub.epoch, pub.transit) for w in pub.awaiting):
            waited = (now_ms() - pub.published_ms) / 1000
            if waited > 30 and self.clock() - self._stuck_logged_at > 30:
                self._stuck_logged_at = self.clock()
                log.warning("handoff of epoch %d waits for %.0f s; reports: %s", pub.epoch, waited,
                            describe_reports(state.reports, now_ms()))
            return pub
        granted = Publication(grant(pub.map), reason=f"handoff of epoch {pub.epoch} complete", published_ms=now_ms())
        self.channel.publish(granted)
        state.publication = granted
        for r in reversed(self.rescales):
            if r.epoch == pub.epoch:
                r.settled_ms = granted.published_ms
                break
        if self.fleet is not None:
            self.fleet.scale_to(granted.map.workers)
        log.info("published %s (handoff complete)", granted.map.describe())
        return granted

    def status(self) -> ControllerStatus:
        """A consistent snapshot for tables, the operator's status, reports and tests (taken
        between steps: never half of a publication)."""
        with self._lock:
            pub = self.publication
            lags = tuple(range_lag(a, self._lag) for a in pub.map.assignments)
            return ControllerStatus(pub.epoch, pub.map, lags, pub.awaiting if pub.transit else frozenset(),
                                    self._pending is not None, self.last_decision, tuple(self.rescales))

    def run(self, stop: threading.Event, interval_seconds: float = 0.2, busy_interval_seconds: float = 0.02) -> None:
        """Step until `stop` is set (run it in a thread); see `step_and_wait`."""
        while not stop.is_set():
            try:
                self.step_and_wait(stop, interval_seconds, busy_interval_seconds)
            except ControllerFenced as exc:
                log.error("%s", exc)
                self.stopped_by = exc
                return
            except Exception:
                log.exception("controller step failed; retrying")
                stop.wait(1.0)

    def step_and_wait(self, stop: threading.Event, interval_seconds: float,
                      busy_interval_seconds: float = 0.02) -> None:
        """One step, then wait for the next: up to `interval_seconds` when idle (less after
        `request_scale` or `stop`), and while a rescale is in flight only until a control record
        arrives (at most `busy_interval_seconds`), since the moved slots pause until a step sees the
        release."""
        pub = self.step()
        if pub.transit or self._pending is not None:
            with self._lock:
                self.channel.poll(busy_interval_seconds)
            return
        deadline = time.monotonic() + interval_seconds
        while not stop.is_set() and time.monotonic() < deadline:
            if self._wake.wait(min(WAKE_CHECK_SECONDS, max(0.0, deadline - time.monotonic()))):
                break
        self._wake.clear()
