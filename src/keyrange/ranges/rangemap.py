"""Range maps: which worker owns which contiguous run of slots, at which epoch.

A slot is a whole partition of the input topic or a hash range of clientIds inside one
(`layout.py`). Nothing here assumes more than "slots are the integers 0..slot_count-1": the
consumer's `SlotLayout` says which partition and which part of its hash range a slot is, and
`describe(layout)` shows a map that way (the JSON keeps slot numbers).

Invariants of a RangeMap, checked on construction:
- the ranges are sorted, contiguous, non-empty and cover 0..slot_count-1 exactly;
- each range has one owner, and the owners are exactly the worker ordinals 0..n-1 (a StatefulSet
  identity: a split adds ordinal n, a merge removes ordinal n-1).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.slots import format_slot_list, parse_slot_list


@dataclass(frozen=True, order=True, slots=True)
class SlotRange:
    """The slots first..last (both inclusive)."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.last < self.first:
            raise ValueError(f"a slot range needs 0 <= first <= last, got {self.first}-{self.last}")

    @property
    def size(self) -> int:
        """Number of slots in the range."""
        return self.last - self.first + 1

    @property
    def slots(self) -> range:
        """The slots, in order."""
        return range(self.first, self.last + 1)

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and self.first <= slot <= self.last

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


@dataclass(frozen=True, slots=True)
class Assignment:
    """One range and the worker ordinal that owns it."""

    range: SlotRange
    worker: int


@dataclass(frozen=True)
class RangeMap:
    """An epoch-numbered map of slot ranges to worker ordinals (see the module docstring)."""

    epoch: int
    """Increases by one with every published change; the newest epoch rules."""
    slot_count: int
    """Slots are 0..slot_count-1."""
    assignments: tuple[Assignment, ...]
    """Ranges in slot order with their owners."""

    def __post_init__(self) -> None:
        if self.epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {self.epoch}")
        if self.slot_count < 1:
            raise ValueError(f"a range map needs at least one slot, got {self.slot_count}")
        expected_first = 0
        for a in self.assignments:
            if a.range.first != expected_first:
                raise ValueError(
                    f"ranges must be contiguous from slot 0: expected a range starting at "
                    f"{expected_first}, got {a.range}"
                )
            expected_first = a.range.last + 1
        if expected_first != self.slot_count:
            raise ValueError(f"ranges cover slots 0..{expected_first - 1}, expected 0..{self.slot_count - 1}")
        owners = sorted(a.worker for a in self.assignments)
        if owners != list(range(len(owners))):
            raise ValueError(f"owners must be the ordinals 0..n-1 once each, got {owners}")

    @classmethod
    def even(cls, slot_count: int, workers: int, epoch: int = 1) -> RangeMap:
        """Slots split as evenly as possible into `workers` ranges, owned in order."""
        if not 1 <= workers <= slot_count:
            raise ValueError(f"cannot spread {slot_count} slots over {workers} workers")
        base, extra = divmod(slot_count, workers)
        assignments, first = [], 0
        for w in range(workers):
            size = base + (1 if w < extra else 0)
            assignments.append(Assignment(SlotRange(first, first + size - 1), w))
            first += size
        return cls(epoch, slot_count, tuple(assignments))

    @property
    def workers(self) -> int:
        """Number of workers (= number of ranges)."""
        return len(self.assignments)

    def __iter__(self) -> Iterator[Assignment]:
        return iter(self.assignments)

    def range_of(self, worker: int) -> SlotRange | None:
        """The range a worker owns, or None when the map gives it nothing."""
        for a in self.assignments:
            if a.worker == worker:
                return a.range
        return None

    def slots_of(self, worker: int) -> frozenset[int]:
        """The slots a worker owns (empty when it owns none)."""
        r = self.range_of(worker)
        return frozenset(r.slots) if r else frozenset()

    def owner_of(self, slot: int) -> int:
        """The worker that owns a slot."""
        for a in self.assignments:
            if slot in a.range:
                return a.worker
        raise KeyError(f"slot {slot} is outside 0..{self.slot_count - 1}")

    def moved_slots(self, newer: RangeMap) -> frozenset[int]:
        """Slots whose owner differs between this map and `newer`."""
        if newer.slot_count != self.slot_count:
            raise ValueError(f"slot counts differ: {self.slot_count} vs {newer.slot_count}")
        return frozenset(s for s in range(self.slot_count) if self.owner_of(s) != newer.owner_of(s))

    def describe(self, layout: SlotLayout | None = None) -> str:
        """A compact one-line form, e.g. `epoch 3: w0=0-5 w1=6-11`; with the consumer's layout, in
        partitions and hash ranges (`epoch 3: w0=0:0-1/4 w1=0:2/4-1:1/4 w2=1:2-3/4`)."""
        return f"epoch {self.epoch}: {self.describe_owners(layout)}"

    def describe_owners(self, layout: SlotLayout | None = None) -> str:
        """`describe` without the epoch: `w0=0-5 w1=6-11` (the StreamConsumer's status.rangeMap)."""
        return " ".join(f"w{a.worker}={self.describe_range(a.range, layout)}" for a in self.assignments)

    def describe_range(self, r: SlotRange, layout: SlotLayout | None = None) -> str:
        """One range in slot numbers, or in partitions and hash ranges with the layout (which must
        be this map's: as many slots)."""
        if layout is None:
            return str(r)
        if layout.slot_count != self.slot_count:
            raise ValueError(f"the layout has {layout.slot_count} slots, the range map {self.slot_count}")
        return layout.describe_range(r.first, r.last)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (the control topic's and the operator status's format)."""
        return {
            "epoch": self.epoch,
            "slotCount": self.slot_count,
            "ranges": [{"slots": str(a.range), "worker": a.worker} for a in self.assignments],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RangeMap:
        """Parse `to_json`'s format; raise ValueError when it is malformed."""
        try:
            assignments = []
            for item in data["ranges"]:
                slots = parse_slot_list(str(item["slots"]))
                if format_slot_list(slots) != str(SlotRange(slots[0], slots[-1])):
                    raise ValueError(f"range {item['slots']!r} is not contiguous")
                assignments.append(Assignment(SlotRange(slots[0], slots[-1]), int(item["worker"])))
            return cls(int(data["epoch"]), int(data["slotCount"]), tuple(assignments))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed range map {dict(data)!r}: {exc}") from None
