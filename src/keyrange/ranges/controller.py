"""The controller: the single writer of assignments for one consumer.

It runs in the local supervisor (`keyrange run`) and in the Kubernetes operator alike. It is
given the bootstrap servers, the group, the slot count, the scaling limits, a lag source and a
fleet (who starts and stops worker processes or pods); it measures lag, asks the pure planner,
and carries out the handoff that `handoff.py` sequences over the control topic (channel.py):

    decide -> handoff.begin -> until the handoff is granted again: handoff.advance(progress, the
    workers' reports, now) -> carry out its actions (announce, scale the fleet, publish, warn)

The phases, their timeouts and what a slow or dying worker does to them are in handoff.py; this
module only reads the control topic, writes what the handoff asks for and keeps the record of
rescales. A split adds the worker before publishing the epoch that uses it; a merge removes the
freed (top) worker only after its handoff completed. One rescale at a time: no decision is taken
while a handoff is in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from keyrange.errors import UserError
from keyrange.ranges.channel import ControllerFenced, ControlState, Prepare, Publication, now_ms
from keyrange.ranges.groupoffsets import lowest_positions
from keyrange.ranges.handoff import (
    Action,
    Announce,
    Handoff,
    Phase,
    Plan,
    Publish,
    ScaleFleet,
    advance,
    begin,
)
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.planner import Decision, Direction, Planner, ScaleOutcome, ScalingLimits, SlotLag, range_lag
from keyrange.ranges.rangemap import RangeMap
from keyrange.ranges.sizing import LoadSource

log = logging.getLogger(__name__)

WAKE_CHECK_SECONDS = 0.05
"""How often an idle wait checks its stop event (a `request_scale` wakes it at once)."""
GROUP_OFFSETS_EVERY_SECONDS = 1.0
"""How often the group's offsets of hash-range slots are committed (as often as workers report)."""


class GroupOffsetSink(Protocol):
    """Where the consumer group's offsets per partition go (groupoffsets.GroupOffsetWriter)."""

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit partition -> offset, forward only."""
        ...

    def close(self) -> None:
        """Release the client."""
        ...


class LagSource(Protocol):
    """Per-slot lag as measured now (worker metrics, Prometheus, or Kafka offsets)."""

    def slot_lag(self) -> Mapping[int, SlotLag]:
        """Lag of every slot that has a measurement."""
        ...


class ControlLog(Protocol):
    """What the controller needs of its consumer's control topic (channel.ControlChannel provides it)."""

    topic: str
    state: ControlState
    """The records read so far, folded (written only by reading: `poll`, `catch_up`)."""

    def claim_writer(self) -> None:
        """Become the group's one controller, fencing any other."""
        ...

    def catch_up(self) -> None:
        """Read to the end of the topic as it is now."""
        ...

    def poll(self, timeout_seconds: float = 0.0) -> int:
        """Read whatever is new, waiting up to `timeout_seconds` for the first record."""
        ...

    def publish(self, publication: Publication) -> None:
        """Write an assignment record."""
        ...

    def announce(self, prepare: Prepare) -> None:
        """Write the prepare record."""
        ...

    def close(self) -> None:
        """Close the topic's clients."""
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
    not_read_ahead: tuple[int, ...] = ()
    """New owners that had not reported their read-ahead when the epoch was published: the handoff
    waited out the read-ahead's timeout for them."""


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
    """True from a decision until its epoch is published (a split's new worker starting, the read-ahead)."""
    last_decision: str
    rescales: tuple[Rescale, ...] = field(default=())
    phase: Phase = Phase.GRANTED
    """Where the current handoff is (handoff.py)."""
    layout: SlotLayout | None = None
    """How the map's slots cut the partitions (for showing ranges as partitions and hash ranges)."""


class Controller:
    """Plans and publishes range maps for one consumer (see the module docstring)."""

    def __init__(self, channel: ControlLog, partitions: int, limits: ScalingLimits, lag_source: LagSource,
                 fleet: WorkerFleet | None = None, clock: Callable[[], float] = time.monotonic,
                 start_timeout_seconds: float = 60.0, warm_timeout_seconds: float = 10.0,
                 wall_clock_ms: Callable[[], int] = now_ms,
                 group_offsets: GroupOffsetSink | None = None) -> None:
        self.channel = channel
        self.partitions = partitions
        """Partitions of the input topic."""
        self.layout = SlotLayout.for_workers(partitions, limits.max_workers)
        """How the partitions are cut into slots: for `workers.max` workers at first; a control topic
        that holds a map keeps that map's layout (`start`)."""
        self.planner = Planner(limits)
        self.planner.layout = self.layout
        self.lag_source = lag_source
        self.fleet = fleet
        self.clock = clock
        """The planner's clock (its cooldowns)."""
        self.wall_clock_ms = wall_clock_ms
        """The handoff's clock: control records carry wall time, and a resumed handoff counts from them."""
        self.rescales: list[Rescale] = []
        self.last_decision = "starting"
        self.start_timeout_seconds = start_timeout_seconds
        """How long a split waits for its new worker to report before it publishes anyway."""
        self.warm_timeout_seconds = warm_timeout_seconds
        """How long a handoff waits for its new owners to read ahead, counted from when they run (a
        split's new worker may take longer than this to start); after that it goes on, and their
        acquire finishes the read-ahead (or restores in full if it failed)."""
        self.group_offsets = group_offsets
        """Commits the consumer group's offset per partition (groupoffsets.py): called with the lowest
        position of each partition's slots while partitions are cut into hash ranges."""
        self._positions: dict[int, int] = {}
        self._positions_at = float("-inf")
        self._handoff: Handoff | None = None
        """The handoff's progress (handoff.py): set by `start`, replaced only once its actions are done."""
        self._lock = threading.RLock()
        self._lag: Mapping[int, SlotLag] = {}
        self._wake = threading.Event()
        self.stopped_by: ControllerFenced | None = None
        """Set when another controller of the group took over and this one stopped (see `run`)."""

    @property
    def handoff(self) -> Handoff:
        """The handoff's progress (after `start`)."""
        assert self._handoff is not None, "Controller.start() was not called"
        return self._handoff

    @property
    def publication(self) -> Publication:
        """The newest publication (after `start`)."""
        return self.handoff.publication

    def start(self) -> Publication:
        """Claim the group's controller role (fencing any other controller at the broker), then
        resume from the control topic, or publish the first map (workers.min even ranges)."""
        self.channel.claim_writer()
        self.channel.catch_up()
        pub = self.channel.state.publication
        if pub is not None:
            try:
                self.layout = SlotLayout.of_slot_count(self.partitions, pub.map.slot_count)
            except ValueError as exc:
                raise UserError(f"the control topic {self.channel.topic}: {exc}") from None
            self.planner.layout = self.layout
            if self.layout.slot_count < self.planner.limits.max_workers:
                log.warning("workers.max is %d but this consumer's range map has %d slots (%d partitions x %d), "
                            "laid out when workers.max was lower: at most %d workers. A new groupId lays it out "
                            "again.", self.planner.limits.max_workers, self.layout.slot_count, self.partitions,
                            self.layout.per_partition, self.layout.slot_count)
        if pub is None:
            slots = self.layout.slot_count
            first = RangeMap.even(slots, min(self.planner.limits.min_workers, slots))
            pub = Publication(first, reason="initial map", published_ms=self.wall_clock_ms())
            self.channel.publish(pub)
            log.info("published %s (initial)", first.describe(self.layout))
        self._handoff = Handoff.from_storage(pub)
        if self.fleet is not None:
            self.fleet.scale_to(max(pub.map.workers, max(pub.awaiting, default=-1) + 1))
        return pub

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        """Split ("up") or merge ("down") once now, skipping the lag thresholds but not the limits or
        the cooldown (the alert webhook calls this). Thread-safe; returns what happened."""
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        with self._lock:
            self.channel.poll(0.0)
            pub = self.publication
            before = pub.map.workers
            if self.handoff.in_flight:
                busy = f"a rescale is in progress ({pub.map.describe(self.layout)})"
                return ScaleOutcome(False, busy, before, before, in_progress=True)
            decision = self.planner.decide(pub.map, self._lag, self.clock(), direction)
            log.info("scale %s requested (%s): %s", direction, reason, decision.reason)
            self.last_decision = decision.reason
            if decision.next_map is None:
                return ScaleOutcome(False, decision.reason, before, before)
            self._begin(decision, reason)
            self._wake.set()  # the run loop follows the handoff from now on, not at its next idle tick
            return ScaleOutcome(True, decision.reason, before, decision.next_map.workers)

    def step(self) -> Publication:
        """Read the control topic, advance a pending rescale or plan the next one; return the newest
        publication. Thread-safe."""
        with self._lock:
            self.channel.poll(0.0)
            if self.handoff.in_flight:
                # The grant first: the moved slots pause until it, and the offsets' commit waits on the broker.
                publication = self._drive()
                self._commit_group_offsets()
                return publication
            self._commit_group_offsets()
            self._lag = self.lag_source.slot_lag()
            load = self.lag_source.load() if isinstance(self.lag_source, LoadSource) else None
            decision = self.planner.decide(self.publication.map, self._lag, self.clock(), load=load)
            self.last_decision = decision.reason
            if decision.next_map is None:
                return self.publication
            return self._begin(decision)

    def _commit_group_offsets(self) -> None:
        """At most once a second, commit the group's offsets from the slots' reported positions."""
        if self.group_offsets is None or not self.layout.splits_partitions:
            return
        now = self.clock()
        if now - self._positions_at < GROUP_OFFSETS_EVERY_SECONDS:
            return
        self._positions_at = now
        lowest = lowest_positions(self.layout, self._positions, self.channel.state.reports)
        if lowest:
            self.group_offsets.commit(lowest)

    def close(self) -> None:
        """Close the control channel and the group offsets' writer."""
        self.channel.close()
        if self.group_offsets is not None:
            self.group_offsets.close()

    def _begin(self, decision: Decision, requested: str = "") -> Publication:
        self._handoff = begin(self.handoff, decision, self.wall_clock_ms(), requested,
                              start_timeout_ms=round(self.start_timeout_seconds * 1000),
                              read_ahead_timeout_ms=round(self.warm_timeout_seconds * 1000))
        return self._drive()

    def _drive(self) -> Publication:
        """Advance the handoff as far as the control state allows now, carrying out each transition's
        actions before adopting it (a failed write raises and leaves the transition to the next step)."""
        while True:
            current = self.handoff
            nxt, actions = advance(current, self.channel.state.reports, self.wall_clock_ms())
            for action in actions:
                self._carry_out(action)
            self._handoff = nxt
            if nxt == current or not nxt.in_flight:
                return nxt.publication

    def _carry_out(self, action: Action) -> None:
        if isinstance(action, Announce):
            self.channel.announce(action.prepare)
        elif isinstance(action, ScaleFleet):
            if self.fleet is not None:
                self.fleet.scale_to(action.workers)
        elif isinstance(action, Publish):
            self.channel.publish(action.publication)
            if action.plan is not None:
                self._record(action.publication, action.plan, action.cold)
            else:
                self._settle(action.publication)
        else:
            log.warning("%s", action.message)

    def _record(self, pub: Publication, plan: Plan, cold: tuple[int, ...]) -> None:
        decision = plan.decision
        self.rescales.append(Rescale(decision.action, decision.reason, pub.epoch, plan.workers_before,
                                     pub.map.workers, pub.transit, plan.decided_ms, pub.published_ms,
                                     requested=plan.requested, not_read_ahead=cold))
        log.info("published %s: %s; waiting for w%s to release %d slots", pub.map.describe(self.layout),
                 decision.reason, ",w".join(map(str, sorted(pub.awaiting))), len(pub.transit))

    def _settle(self, granted: Publication) -> None:
        for r in reversed(self.rescales):
            if r.epoch == granted.epoch - 1:
                r.settled_ms = granted.published_ms
                break
        log.info("published %s (handoff complete)", granted.map.describe(self.layout))

    def status(self) -> ControllerStatus:
        """A consistent snapshot for tables, the operator's status, reports and tests (taken
        between steps: never half of a publication)."""
        with self._lock:
            handoff = self.handoff
            pub = handoff.publication
            lags = tuple(range_lag(a, self._lag) for a in pub.map.assignments)
            starting = handoff.phase in (Phase.PREPARING, Phase.STARTING, Phase.READING_AHEAD)
            return ControllerStatus(pub.epoch, pub.map, lags, handoff.awaiting, starting, self.last_decision,
                                    tuple(self.rescales), handoff.phase, self.layout)

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
        self.step()
        if self.handoff.in_flight:
            with self._lock:
                self.channel.poll(busy_interval_seconds)
            return
        deadline = time.monotonic() + interval_seconds
        while not stop.is_set() and time.monotonic() < deadline:
            if self._wake.wait(min(WAKE_CHECK_SECONDS, max(0.0, deadline - time.monotonic()))):
                break
        self._wake.clear()
