"""Which held slot each record of a fetched batch belongs to, decided for the whole batch in one pass.

The engine's dispatch (engine.py) asks this first. A whole partition's records all go to its slot.
A partition cut into hash ranges (ranges/layout.py) is fetched whole by every worker holding one
of its ranges, so most of its records may be other workers' (k readers of a partition: each skips
k - 1 in k). They are told apart by the key alone (the value is not parsed) and skipped at the cost
of one lookup of the key's cached part: no call into a slot per skipped record.

What a skip must still do: the partition's held slots move their committable offset past the
records that are not theirs (commitwindow.py), or a hash range whose clients went quiet would never
commit its position. That is done once per batch, after the batch's own records were admitted
(`pass_ends`): each held slot of the partition passes the partition's last offset in the batch.
The same as passing each record in turn, because offsets of a partition only grow within a batch
(a re-assignment from a lower offset drops the fetch it overlaps: engine.py), and a slot's own
records in the batch are admitted or refused before: the last offset is either another slot's, or
its own and already in its window. (Were a batch's offsets ever to go down, passing its last one
would only pass less, never past an unfinished record.) A revoked slot (being released) is not passed: its position
must stay at its own records it no longer handles, which its next owner will.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from confluent_kafka import Message

from keyrange.ranges.layout import SlotRouter


class RoutedSlot(Protocol):
    """What the routing needs of a held slot (slot.py's SlotState)."""

    @property
    def slot(self) -> int:
        """The slot's number in the range map."""

    @property
    def revoked(self) -> bool:
        """Being released: not passed any more."""

    def pass_offset(self, offset: int) -> None:
        """An offset of the slot's partition that is another slot's: the committable offset may move past it."""


S = TypeVar("S", bound=RoutedSlot)


@dataclass(slots=True)
class RoutedBatch(Generic[S]):
    """A fetched batch, routed: what the dispatch admits, logs and passes."""

    own: list[tuple[S, Message]]
    """The records of held slots (revoked ones included: their intake refuses them), in fetch order."""
    errors: list[Message]
    """The batch's error events (a fetch error of a partition), in fetch order."""
    ends: dict[int, Message]
    """Per held partition cut into hash ranges, its last record in the batch (`BatchRouter.pass_ends`)."""


class BatchRouter(Generic[S]):
    """Routes fetched batches to the slots held when it was made (module docstring); the engine
    makes a new one whenever it acquires or releases a slot."""

    __slots__ = ("_held", "_parts", "_router", "_whole")

    def __init__(self, router: SlotRouter, held: Mapping[int, Sequence[S]]) -> None:
        """`held`: the held slots of each partition, all of `router`'s layout."""
        self._router = router
        per = router.layout.per_partition
        self._held = {p: tuple(slots) for p, slots in held.items() if slots}
        self._whole: dict[int, S] = {}
        """Partition -> its slot, where a slot is the whole partition."""
        self._parts: dict[int, list[S | None]] = {}
        """Partition cut into hash ranges -> its held slot by part (slot % per_partition), None where
        another worker holds that part."""
        for p, slots in self._held.items():
            if per == 1:
                self._whole[p] = slots[0]
            else:
                parts: list[S | None] = [None] * per
                for slot in slots:
                    parts[slot.slot % per] = slot
                self._parts[p] = parts

    def route(self, messages: Sequence[Message]) -> RoutedBatch[S]:
        """Route a fetched batch: each record of a held slot with its slot; others' records skipped,
        leaving the partition's last record in `ends` for `pass_ends`."""
        own: list[tuple[S, Message]] = []
        errors: list[Message] = []
        ends: dict[int, Message] = {}
        whole, split = self._whole, self._parts
        known, part_of = self._router.known_parts.get, self._router.part_of
        # A fetch returns each partition's records in runs: the partition is looked up once per run.
        run: int | None = None
        run_slot: S | None = None
        parts: list[S | None] | None = None
        last: Message | None = None  # the run's latest record, where its partition is cut into hash ranges
        for m in messages:
            if m.error() is not None:
                errors.append(m)
                continue
            p = m.partition()
            if p != run:
                if last is not None:
                    ends[run] = last  # type: ignore[index]
                    last = None
                run, run_slot, parts = p, whole.get(p), split.get(p)  # type: ignore[arg-type]
            if run_slot is not None:
                own.append((run_slot, m))
                continue
            if parts is None:
                continue  # fetched just before its partition was released
            last = m
            key = m.key()
            part = known(key)  # type: ignore[arg-type]
            slot = parts[part_of(key) if part is None else part]
            if slot is not None:
                own.append((slot, m))
        if last is not None:
            ends[run] = last  # type: ignore[index]
        return RoutedBatch(own, errors, ends)

    def pass_ends(self, ends: Mapping[int, Message]) -> None:
        """After the batch's own records were admitted: move each held, unrevoked slot of each
        partition in `ends` past that partition's last offset in the batch."""
        for p, m in ends.items():
            offset: int = m.offset()  # type: ignore[assignment]
            for slot in self._held[p]:
                if not slot.revoked:
                    slot.pass_offset(offset)
