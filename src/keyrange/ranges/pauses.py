"""The pause a handoff causes, measured where it ends: at the new owner's first event of a moved slot.

A moved slot stops at its old owner when the controller publishes the epoch that puts it in
transit (the publication's `published_ms`), and flows again when its new owner starts the first
event after acquiring it. The pause of that slot is

    (start of that event) - max(published_ms, the event's `created`)

The `max` keeps an idle slot honest: an event created after the publication waited only since it
was created, so a handoff of a slot with no traffic pauses nobody. The two times come from two
machines' wall clocks (the controller's and the worker's), like the event latency.

The member (member.py) says which slots it acquires after a transit (`expect`); the worker's
attempt runner calls `started` for every event it starts (a dict lookup while nothing is
expected). Each pause is observed in `keyrange_handoff_pause_seconds` and the newest handoff's
(the largest pause among the slots one epoch granted this worker) goes into the worker's report
on the control topic, from which the operator puts it in the StreamConsumer's status.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from keyrange import metrics


@dataclass(frozen=True)
class HandoffPause:
    """The pause of the newest handoff that granted this worker slots."""

    epoch: int
    """The epoch that granted the slots (the one after the transit)."""
    pause_ms: int
    """The largest pause among the slots of that grant whose first event has started."""
    at_ms: int
    """When that pause ended (the start of the event that measured it), epoch ms."""


class HandoffPauses:
    """Measures the pause of each slot acquired after a transit (see the module docstring).

    Used from the worker's event loop only.
    """

    def __init__(self, consumer: str, worker: str) -> None:
        self._histogram = metrics.HANDOFF_PAUSE.labels(consumer, worker)
        self._expected: dict[int, tuple[int, int]] = {}
        """slot -> (published_ms of the transit, epoch of the grant)."""
        self.last: HandoffPause | None = None

    def expect(self, slot: int, transit_published_ms: int, grant_epoch: int) -> None:
        """`slot` was in transit since `transit_published_ms` and is being acquired under `grant_epoch`."""
        self._expected[slot] = (transit_published_ms, grant_epoch)

    def forget(self, slots: Iterable[int]) -> None:
        """The slots were released before their first event: nothing to measure."""
        for slot in slots:
            self._expected.pop(slot, None)

    def started(self, slot: int, started_s: float, created_ms: int) -> None:
        """An event of `slot` started at `started_s` (epoch seconds); measure if it is the first."""
        if not self._expected:
            return
        expected = self._expected.pop(slot, None)
        if expected is None:
            return
        published_ms, epoch = expected
        started_ms = int(started_s * 1000)
        pause_ms = max(0, started_ms - max(published_ms, created_ms))
        self._histogram.observe(pause_ms / 1000)
        last = self.last
        if last is not None and (last.epoch > epoch or (last.epoch == epoch and last.pause_ms >= pause_ms)):
            return  # an older grant, or a shorter pause of the same one
        self.last = HandoffPause(epoch, pause_ms, started_ms)
