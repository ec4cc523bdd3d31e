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

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from keyrange.ranges.layout import SlotLayout
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


@dataclass(frozen=True)
class ScaleRequest:
    """A request to split (`up`) or merge (`down`), e.g. from an Alertmanager alert."""

    direction: Literal["up", "down"]
    reason: str
    """Why, for status and the Kubernetes Event (e.g. the alert name)."""


@dataclass(frozen=True)
class ScaleOutcome:
    """What the controller did with a ScaleRequest."""

    accepted: bool
    from_workers: int
    to_workers: int
    message: str = field(default="")
    """Why it was refused (cooldown, bounds) or what it will do."""


class RangeControl(Protocol):
    """One consumer's range controller as the operator sees it."""

    def desired_workers(self) -> int:
        """Worker pods the controller needs now (more before a split publishes, fewer after a merge)."""

    def workers_available(self, ready: int) -> None:
        """Tell the controller how many worker pods (ordinals 0..ready-1) are ready."""

    def request_scale(self, request: ScaleRequest) -> ScaleOutcome:
        """Ask for a split or a merge; the controller applies its planner's limits and cooldown."""

    def update_spec(self, spec: StreamConsumerSpec) -> None:
        """The StreamConsumer's spec changed (limits, thresholds)."""

    def status(self) -> RangeStatus:
        """The current range map and lag."""

    def take_decisions(self) -> list[PlannedRescale]:
        """The planner's own rescales since the last call (each is returned once); those that
        `request_scale` asked for are left out: their requester records them."""

    def close(self) -> None:
        """Stop background work; the consumer was deleted or the operator is stopping."""


class StaticRangeControl:
    """An even range map over a fixed worker count, with no Kafka and no lag-driven planning.

    The cluster uses `clusterassigner.KafkaRangeControl`; this one stands in where the operator runs
    without Kafka (tests of the operator and of the alert webhook, via `operator_memo`'s factory).
    It follows `workers.replicas` (or `workers.min`) and refuses scale requests with a clear message.
    """

    def __init__(self, spec: StreamConsumerSpec) -> None:
        self._spec = spec
        self._ready = 0

    def _workers(self) -> int:
        spec = self._spec
        want = spec.workers.replicas or spec.workers.min
        return max(1, min(want, spec.workers.max))

    def desired_workers(self) -> int:
        """The fixed worker count."""
        return self._workers()

    def workers_available(self, ready: int) -> None:
        """Remember the ready pods (reported in status only)."""
        self._ready = ready

    def request_scale(self, request: ScaleRequest) -> ScaleOutcome:
        """Always refused: a static map does not rescale."""
        n = self._workers()
        return ScaleOutcome(False, n, n, "no range controller is running for this consumer; "
                                         "set spec.workers.replicas to change the worker count")

    def update_spec(self, spec: StreamConsumerSpec) -> None:
        """Adopt the new bounds and fixed count."""
        self._spec = spec

    def take_decisions(self) -> list[PlannedRescale]:
        """None: a static map never rescales."""
        return []

    def status(self) -> RangeStatus:
        """The even map over the fixed worker count, epoch 1."""
        layout = SlotLayout.for_workers(self._spec.kafka.partitions, self._spec.workers.max)
        return RangeStatus(**map_status(RangeMap.even(layout.slot_count, self._workers(), epoch=1), layout))

    def close(self) -> None:
        """Nothing runs in the background."""
