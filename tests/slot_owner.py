"""A fake of the engine API a RangeMember drives (ranges/member.py `SlotOwner`), for unit tests."""

from __future__ import annotations

from collections.abc import Collection, Set


class FakeSlotOwner:
    """Holds what it is told to acquire, at once; remembers each acquire."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.acquired: list[set[int]] = []
        self.slot_count: int | None = None

    @property
    def held_slots(self) -> Set[int]:
        return self.held

    async def acquire(self, slots: Collection[int]) -> None:
        self.acquired.append(set(slots))
        self.held |= set(slots)

    async def release(self, slots: Collection[int]) -> None:
        self.held -= set(slots)

    async def prefetch(self, slots: Collection[int]) -> bool:
        return True

    def use_slot_count(self, slot_count: int) -> None:
        self.slot_count = slot_count

    def committed_positions(self) -> dict[int, int]:
        return {}
