"""The controller: the single writer of assignments for one consumer.

It runs in the local supervisor (`keyrange run`) and in the Kubernetes operator alike. It is
given the bootstrap servers, the group, the slot count, the scaling limits, a lag source and a
fleet (who starts and stops worker processes or pods); it measures lag, asks the pure planner,
and drives the two-phase handoff over the control topic (see `control.py`):

    decide -> fleet.scale_to(max(old, new)) -> publish epoch E (moved slots in transit)
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
from keyrange.ranges.control import ControlChannel, Publication, describe_reports, now_ms
from keyrange.ranges.planner import Direction, Planner, ScalingLimits, SlotLag, range_lag, with_epoch
from keyrange.ranges.rangemap import RangeMap

log = logging.getLogger(__name__)


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
    settled_ms: int | None = None
    """Wall-clock time the new owners were allowed to acquire."""


@dataclass(frozen=True)
class ControllerStatus:
    """What the controller reports (the table, the operator's status, the demo's report)."""

    epoch: int
    map: RangeMap
    range_lag: tuple[SlotLag, ...]
    """Lag per range, in map order."""
    handoff_awaiting: frozenset[int]
    """Workers whose release the current handoff waits for (empty when settled)."""
    last_decision: str
    rescales: tuple[Rescale, ...] = field(default=())


class Controller:
    """Plans and publishes range maps for one consumer (see the module docstring)."""

    def __init__(self, channel: ControlChannel, slot_count: int, limits: ScalingLimits, lag_source: LagSource,
                 fleet: WorkerFleet | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.channel = channel
        self.slot_count = slot_count
        self.planner = Planner(limits)
        self.lag_source = lag_source
        self.fleet = fleet
        self.clock = clock
        self.rescales: list[Rescale] = []
        self.last_decision = "starting"
        self._forced: tuple[Direction, str] | None = None
        self._lock = threading.Lock()
        self._lag: Mapping[int, SlotLag] = {}
        self._stuck_logged_at = 0.0

    @property
    def publication(self) -> Publication:
        """The newest publication (after `start`)."""
        pub = self.channel.state.publication
        assert pub is not None, "Controller.start() was not called"
        return pub

    def start(self) -> Publication:
        """Resume from the control topic, or publish the first map (workers.min even ranges)."""
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

    def request_scale(self, direction: Direction, reason: str) -> None:
        """Ask for one split ("up") or merge ("down") at the next step, skipping lag thresholds
        but not limits or cooldown (the alert webhook calls this). Thread-safe."""
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        with self._lock:
            self._forced = (direction, reason)

    def step(self) -> Publication:
        """Read the control topic, advance a pending handoff or plan the next map; return the newest."""
        self.channel.poll(0.0)
        pub = self.publication
        if pub.transit:
            return self._advance_handoff(pub)
        self._lag = self.lag_source.slot_lag()
        with self._lock:
            forced, self._forced = self._forced, None
        decision = self.planner.decide(pub.map, self._lag, self.clock(), forced[0] if forced else None)
        if forced:
            log.info("scale %s requested (%s): %s", forced[0], forced[1], decision.reason)
        self.last_decision = decision.reason
        if decision.next_map is None:
            return pub
        new_map = with_epoch(decision.next_map, pub.epoch + 1)
        moved = decision.moved_slots
        awaiting = frozenset(pub.map.owner_of(s) for s in moved)
        if self.fleet is not None:
            self.fleet.scale_to(max(pub.map.workers, new_map.workers))
        nxt = Publication(new_map, moved, awaiting, decision.reason, now_ms())
        self.channel.publish(nxt)
        self.channel.state.publication = nxt
        self.rescales.append(Rescale(decision.action, decision.reason, new_map.epoch, pub.map.workers,
                                     new_map.workers, moved, nxt.published_ms))
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
                            describe_reports(state.reports))
            return pub
        grant = Publication(with_epoch(pub.map, pub.epoch + 1), reason=f"handoff of epoch {pub.epoch} complete",
                            published_ms=now_ms())
        self.channel.publish(grant)
        state.publication = grant
        for r in reversed(self.rescales):
            if r.epoch == pub.epoch:
                r.settled_ms = grant.published_ms
                break
        if self.fleet is not None:
            self.fleet.scale_to(grant.map.workers)
        log.info("published %s (handoff complete)", grant.map.describe())
        return grant

    def status(self) -> ControllerStatus:
        """A snapshot for tables, the operator's status and reports."""
        pub = self.publication
        lags = tuple(range_lag(a, self._lag) for a in pub.map.assignments)
        return ControllerStatus(pub.epoch, pub.map, lags, pub.awaiting if pub.transit else frozenset(),
                                self.last_decision, tuple(self.rescales))

    def run(self, stop: threading.Event, interval_seconds: float = 0.2) -> None:
        """Step until `stop` is set (run it in a thread)."""
        while not stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("controller step failed; retrying")
                stop.wait(1.0)
            stop.wait(interval_seconds)
