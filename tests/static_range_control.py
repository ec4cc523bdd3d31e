"""A range control with a fixed, even map and no Kafka: the operator's `RangeControl` seam in tests."""

from __future__ import annotations

from keyrange.operator.rangecontrol import PlannedRescale, RangeStatus, map_status
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.planner import Direction, ScaleOutcome
from keyrange.ranges.rangemap import RangeMap
from keyrange.spec import StreamConsumerSpec


class StaticRangeControl:
    """An even range map over a fixed worker count, with no Kafka and no lag-driven planning.

    The cluster uses `clusterassigner.KafkaRangeControl`; this one stands in where a test runs the
    operator's parts without Kafka. It follows `workers.replicas` (or `workers.min`) and refuses
    scale requests with a clear message.
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

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        """Always refused: a static map does not rescale."""
        n = self._workers()
        return ScaleOutcome(False, "no range controller is running for this consumer; "
                                   "set spec.workers.replicas to change the worker count", n, n)

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
