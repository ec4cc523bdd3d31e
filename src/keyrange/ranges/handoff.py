"""The handoff of moved slots as one state machine: an immutable `Handoff` progress and a pure `advance`.

The controller (controller.py) decides a rescale with the planner, starts it with `begin`, and then
only carries out the actions `advance` returns; it never decides a step of the handoff itself.
The members (member.py) follow the records those actions write. The phases, in order:

    GRANTED        nothing in flight: the newest publication has nothing in transit.
      | begin(decision)
    PREPARING      -> Announce(prepare: the moved slots per new owner), ScaleFleet(max(old, new))
    STARTING       a split waits for its new worker to report (a report up to 2 s older than the
                   decision counts: a standby worker heartbeats every second), at most
                   `start_timeout_ms` from the decision; then READING_AHEAD (Warn if it timed out)
    READING_AHEAD  every new owner reports the moved slots read ahead for the prepare, at most
                   `read_ahead_timeout_ms` from entering this phase (so from when a split's new
                   worker runs, not from the decision); then -> Publish(epoch E: the new map,
                   the moved slots in transit, awaiting their old owners) (Warn if it timed out)
    IN_TRANSIT     every awaited old owner reports E (or newer) without the moved slots; while it
                   waits past STUCK_WARNING_MS, a Warn with every report's age each STUCK_WARNING_MS;
                   then -> Publish(E+1: the same map, nothing in transit), ScaleFleet(new)
    GRANTED

Each `advance` makes at most one transition. The controller carries out its actions in order and
adopts the returned progress only once all of them succeeded: a write that fails leaves the
progress as it was, and the next step makes the same transition again (control records are keyed,
so writing one twice is harmless).

What a slow or dying worker does to it:
- a split's new worker slow to start: STARTING waits up to `start_timeout_ms`, then the epoch is
  published anyway (the worker acquires its slots whenever it comes up);
- a new owner that does not read ahead in time (slow, or dead): READING_AHEAD hands over anyway
  after `read_ahead_timeout_ms`; its acquire finishes the read-ahead, or restores in full;
- an old owner whose release fails, or that dies in transit: IN_TRANSIT never grants before the
  release is reported; the worker is restarted (by `keyrange run` or its StatefulSet), applies E
  (holding nothing), reports, and the grant follows. The warning's report ages tell a worker still
  in its release or gone (its report gets older) from one that runs but has not read E (fresh).

The progress is persisted in the control topic only as the assignment record (`Publication`): a
restarted controller resumes in transit or granted from it (`Handoff.from_storage`). A rescale
decided but not yet published is not persisted: a new controller plans again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from keyrange.ranges.channel import Prepare, Publication, WorkerReport, describe_reports
from keyrange.ranges.ownership import grant, has_read_ahead, has_released, plan_handoff
from keyrange.ranges.planner import Decision, with_epoch
from keyrange.ranges.slots import format_slot_list

STUCK_WARNING_MS = 30_000
"""How long a transit waits before it is logged, and how often it is logged again."""
FRESH_REPORT_SLACK_MS = 2_000
"""How much older than the decision a new worker's report may be and still count as running."""


class Phase(enum.Enum):
    """Where a handoff is (see the module docstring)."""

    GRANTED = "granted"
    PREPARING = "preparing"
    STARTING = "waiting for the new worker"
    READING_AHEAD = "reading ahead"
    IN_TRANSIT = "in transit"


@dataclass(frozen=True)
class Plan:
    """A decided rescale, from `begin` until its epoch is published."""

    decision: Decision
    """The planner's decision (its `next_map` is not None)."""
    prepare: Prepare
    """The moved slots per new owner, announced before the epoch."""
    decided_ms: int
    """Wall-clock time of the decision (epoch ms)."""
    requested: str
    """The reason given to `request_scale` (an alert's name); empty when the planner decided alone."""
    start_timeout_ms: int
    """How long a split waits for its new worker to report."""
    read_ahead_timeout_ms: int
    """How long the new owners may read ahead, counted from when the new workers run."""
    workers_before: int
    """How many workers the map had when the rescale was decided."""

    @property
    def workers_after(self) -> int:
        """How many workers the decided map has."""
        assert self.decision.next_map is not None
        return self.decision.next_map.workers

    @property
    def new_workers(self) -> range:
        """The ordinals a split adds (empty for a merge)."""
        return range(self.workers_before, self.workers_after)


@dataclass(frozen=True)
class Handoff:
    """The immutable progress of one consumer's handoff (see the module docstring)."""

    phase: Phase
    publication: Publication
    """The newest publication this controller wrote (or resumed from)."""
    plan: Plan | None = None
    """The decided rescale while PREPARING, STARTING or READING_AHEAD; None otherwise."""
    entered_ms: int = 0
    """Wall-clock time this phase was entered (epoch ms)."""
    deadline_ms: int | None = None
    """When STARTING or READING_AHEAD stops waiting and goes on anyway."""
    warned_ms: int | None = None
    """When IN_TRANSIT last logged that it waits."""

    @classmethod
    def from_storage(cls, publication: Publication) -> Handoff:
        """The progress an assignment record holds: in transit while it has slots in transit."""
        if publication.transit:
            return cls(Phase.IN_TRANSIT, publication, entered_ms=publication.published_ms)
        return cls(Phase.GRANTED, publication, entered_ms=publication.published_ms)

    @property
    def in_flight(self) -> bool:
        """True from `begin` until the grant is published (no new rescale is decided meanwhile)."""
        return self.phase is not Phase.GRANTED

    @property
    def awaiting(self) -> frozenset[int]:
        """The workers whose release the handoff waits for (empty unless IN_TRANSIT)."""
        return self.publication.awaiting if self.phase is Phase.IN_TRANSIT else frozenset()


@dataclass(frozen=True)
class Announce:
    """Write the prepare record."""

    prepare: Prepare


@dataclass(frozen=True)
class ScaleFleet:
    """Make workers 0..workers-1 run."""

    workers: int


@dataclass(frozen=True)
class Publish:
    """Write an assignment record: the epoch that puts a plan's moved slots in transit, or the grant."""

    publication: Publication
    plan: Plan | None = None
    """The rescale whose moved slots it puts in transit; None for the grant that ends a handoff."""
    cold: tuple[int, ...] = ()
    """The new owners that had not reported their read-ahead when the epoch was published (the
    read-ahead's timeout was waited out)."""


@dataclass(frozen=True)
class Warn:
    """Log a warning: the handoff goes on without something it waited for, or waits long."""

    message: str


Action = Announce | ScaleFleet | Publish | Warn


def begin(handoff: Handoff, decision: Decision, now_ms: int, requested: str, *, start_timeout_ms: int,
          read_ahead_timeout_ms: int) -> Handoff:
    """The progress of a rescale the planner just decided from a GRANTED handoff (no action yet:
    the first `advance` announces it)."""
    if handoff.in_flight:
        raise ValueError(f"a handoff is already {handoff.phase.value}")
    if decision.next_map is None:
        raise ValueError("the decision keeps the current map: nothing to hand over")
    pub = handoff.publication
    prepare = Prepare(pub.epoch, plan_handoff(pub.map, decision.next_map).moves, now_ms)
    plan = Plan(decision, prepare, now_ms, requested, start_timeout_ms, read_ahead_timeout_ms, pub.map.workers)
    return Handoff(Phase.PREPARING, pub, plan, entered_ms=now_ms)


def advance(handoff: Handoff, reports: Mapping[int, WorkerReport],
            now_ms: int) -> tuple[Handoff, tuple[Action, ...]]:
    """The next step of `handoff` given the workers' newest `reports` at wall-clock `now_ms`:
    the new progress and the actions to carry out, in order, before adopting it."""
    if handoff.phase is Phase.PREPARING:
        return _prepared(handoff, now_ms)
    if handoff.phase is Phase.STARTING:
        return _starting(handoff, reports, now_ms)
    if handoff.phase is Phase.READING_AHEAD:
        return _reading_ahead(handoff, reports, now_ms)
    if handoff.phase is Phase.IN_TRANSIT:
        return _in_transit(handoff, reports, now_ms)
    return handoff, ()


def _plan(handoff: Handoff) -> Plan:
    assert handoff.plan is not None, f"{handoff.phase} without a plan"
    return handoff.plan


def _prepared(handoff: Handoff, now_ms: int) -> tuple[Handoff, tuple[Action, ...]]:
    plan = _plan(handoff)
    starting = replace(handoff, phase=Phase.STARTING, entered_ms=now_ms,
                       deadline_ms=plan.decided_ms + plan.start_timeout_ms)
    return starting, (Announce(plan.prepare), ScaleFleet(max(plan.workers_before, plan.workers_after)))


def _starting(handoff: Handoff, reports: Mapping[int, WorkerReport],
              now_ms: int) -> tuple[Handoff, tuple[Action, ...]]:
    plan = _plan(handoff)
    # Publishing only once the new worker runs keeps the moved slots flowing at their old owner
    # while the new process starts.
    fresh_ms = plan.decided_ms - FRESH_REPORT_SLACK_MS
    waiting = [w for w in plan.new_workers if (r := reports.get(w)) is None or r.at_ms < fresh_ms]
    assert handoff.deadline_ms is not None
    if waiting and now_ms < handoff.deadline_ms:
        return handoff, ()
    reading = replace(handoff, phase=Phase.READING_AHEAD, entered_ms=now_ms,
                      deadline_ms=now_ms + plan.read_ahead_timeout_ms)
    if not waiting:
        return reading, ()
    return reading, (Warn(f"worker(s) {waiting} did not report within {plan.start_timeout_ms / 1000:.0f} s; "
                          "publishing anyway"),)


def _reading_ahead(handoff: Handoff, reports: Mapping[int, WorkerReport],
                   now_ms: int) -> tuple[Handoff, tuple[Action, ...]]:
    plan = _plan(handoff)
    # The moved slots keep flowing at their old owners while the new ones read ahead, so the pause
    # after the release is only the catch-up on what was appended since.
    prepare = plan.prepare
    cold = [w for w, slots in prepare.moves.items()
            if (r := reports.get(w)) is None or not has_read_ahead(r.warm_epoch, r.warm, prepare.epoch, slots)]
    assert handoff.deadline_ms is not None
    if cold and now_ms < handoff.deadline_ms:
        return handoff, ()
    pub = handoff.publication
    assert plan.decision.next_map is not None
    new_map = with_epoch(plan.decision.next_map, pub.epoch + 1)
    moving = plan_handoff(pub.map, new_map)
    transit = Publication(new_map, moving.moved, moving.awaiting, plan.decision.reason, now_ms)
    published = Handoff(Phase.IN_TRANSIT, transit, entered_ms=now_ms)
    warning: tuple[Action, ...] = ()
    if cold:
        seen = "; ".join(_last_seen(w, reports.get(w), now_ms, prepare.epoch) for w in cold)
        warning = (Warn(f"worker(s) {cold} did not read ahead within {plan.read_ahead_timeout_ms / 1000:.0f} s; "
                        "handing over anyway (their acquire finishes the read-ahead, or restores in full if it "
                        f"failed); {seen}"),)
    return published, (*warning, Publish(transit, plan, tuple(cold)))


def _last_seen(worker: int, report: WorkerReport | None, now_ms: int, prepare_epoch: int) -> str:
    """What the controller last read from a worker, telling one gone silent from one that reports
    without having read ahead, and one that never read the prepare from one that did not act on it."""
    if report is None:
        return f"w{worker}: no report"
    warm = format_slot_list(sorted(report.warm)) if report.warm else "nothing"
    seen = (f"w{worker}: last report {max(now_ms - report.at_ms, 0) / 1000:.1f} s ago at epoch {report.epoch}, "
            f"read ahead {warm} for epoch {report.warm_epoch}")
    if report.read_to < 0:
        return seen  # a worker that does not say what it read
    if report.prepare_epoch == prepare_epoch:
        return f"{seen}, had read the prepare of epoch {prepare_epoch}"
    return (f"{seen}, had not read the prepare of epoch {prepare_epoch} (its newest: epoch {report.prepare_epoch}; "
            f"control topic read to offset {report.read_to})")


def _in_transit(handoff: Handoff, reports: Mapping[int, WorkerReport],
                now_ms: int) -> tuple[Handoff, tuple[Action, ...]]:
    pub = handoff.publication
    released = [(r := reports.get(w)) is not None and has_released(r.epoch, r.held, pub.epoch, pub.transit)
                for w in pub.awaiting]
    if all(released):
        granted = Publication(grant(pub.map), reason=f"handoff of epoch {pub.epoch} complete", published_ms=now_ms)
        return (Handoff(Phase.GRANTED, granted, entered_ms=now_ms),
                (Publish(granted), ScaleFleet(granted.map.workers)))
    waited_ms = now_ms - pub.published_ms
    if waited_ms <= STUCK_WARNING_MS or (handoff.warned_ms is not None
                                         and now_ms - handoff.warned_ms <= STUCK_WARNING_MS):
        return handoff, ()
    return replace(handoff, warned_ms=now_ms), (Warn(
        f"handoff of epoch {pub.epoch} waits for {waited_ms / 1000:.0f} s; reports: "
        f"{describe_reports(reports, now_ms)}"),)
