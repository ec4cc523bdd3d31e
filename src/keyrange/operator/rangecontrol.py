"""The seam between the operator and a consumer's range controller.

In a cluster the operator runs one range controller per StreamConsumer. The controller owns the
range map and the two-phase handoff; the operator owns pods. They meet here:

- a split: the controller wants one more worker -> `desired_workers()` grows -> the operator scales
  the StatefulSet up -> the new pod's worker reports on the control topic (the handoff's STARTING
  phase, ranges/handoff.py; `workers_available(n)` tells the ready pods to controls without one)
  -> only then does the controller publish the epoch that gives the new ordinal slots;
- a merge: the controller publishes the epoch without the last ordinal, waits for its release
  (IN_TRANSIT), and only then lowers `desired_workers()` -> the operator scales down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.planner import Direction, ScaleOutcome
from keyrange.ranges.rangemap import RangeMap
from keyrange.spec import StreamConsumerSpec


@dataclass(frozen=True)
class RangeStatus:
    """What the controller reports for `status` of the StreamConsumer."""

    epoch: int
    """Epoch of the newest published range map (0: none yet)."""
    workers: int
    """Workers the newest range map uses."""
    ranges: tuple[tuple[int, str], ...] = ()
    """(worker ordinal, slot list such as "0-5") in slot order."""
    partition_ranges: tuple[tuple[int, str], ...] = ()
    """The same ranges as partitions and hash ranges of partitions ("0-5", or "0:0-1/4" for the
    first two quarters of partition 0's clients: SlotLayout.describe_range)."""
    lag_records: int | None = None
    """Records not yet handled, summed over ranges; None while unknown."""
    lag_seconds: float | None = None
    """Age of the oldest unfinished event; None while unknown."""
    handoff_in_progress: bool = False
    """True between publishing an epoch that moves slots and the new owners acquiring them."""
    problem: str | None = None
    """Why the controller cannot run (e.g. Kafka unreachable); None when it runs."""
    last_handoff: HandoffSummary | None = None
    """The newest handoff whose pause a new owner measured (None before the first)."""


def map_status(m: RangeMap, layout: SlotLayout | None) -> dict[str, Any]:
    """RangeStatus's fields that come from the map: epoch, workers and its ranges, in slots and in
    partitions (with the consumer's layout; without one, slots are whole partitions)."""
    return {"epoch": m.epoch, "workers": m.workers,
            "ranges": tuple((a.worker, str(a.range)) for a in m),
            "partition_ranges": tuple((a.worker, m.describe_range(a.range, layout)) for a in m)}


@dataclass(frozen=True)
class HandoffSummary:
    """The pause of the newest handoff, as its new owners reported it (ranges/pauses.py)."""

    epoch: int
    """The epoch that granted the moved slots."""
    pause_seconds: float
    """The largest pause among the moved slots: from their transit's publication to their new
    owner's first event (or that event's creation, if later)."""
    worker: int
    """The new owner that saw it."""
    at_ms: int
    """When that pause ended, epoch ms."""


@dataclass(frozen=True)
class PlannedRescale:
    """A rescale the controller's planner decided by itself (lag, cooldown, workers.min/max)."""

    from_workers: int
    to_workers: int
    reason: str
    """The planner's reason, e.g. "split 0-5: range 0-5 lags 9000 records / 2.0 s"."""
    decided_ms: int


class RangeControl(Protocol):
    """One consumer's range controller as the operator sees it."""

    def desired_workers(self) -> int:
        """Worker pods the controller needs now (more before a split publishes, fewer after a merge)."""

    def workers_available(self, ready: int) -> None:
        """Tell the controller how many worker pods (ordinals 0..ready-1) are ready."""

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        """Ask for a split (`up`) or a merge (`down`), `reason` saying why for status and the
        Kubernetes Event (e.g. the alert name); the controller applies its planner's limits and
        cooldown (`Controller.request_scale`'s contract)."""

    def update_spec(self, spec: StreamConsumerSpec) -> None:
        """The StreamConsumer's spec changed (limits, thresholds)."""

    def status(self) -> RangeStatus:
        """The current range map and lag."""

    def take_decisions(self) -> list[PlannedRescale]:
        """The planner's own rescales since the last call (each is returned once); those that
        `request_scale` asked for are left out: their requester records them."""

    def close(self) -> None:
        """Stop background work; the consumer was deleted or the operator is stopping."""
