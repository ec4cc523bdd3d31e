"""How a topic's partitions are cut into slots: whole partitions, or hash ranges inside them.

A slot is a hash range of clientIds inside one partition. With `per_partition` slots per
partition, slot `s` is partition `s // per_partition`, and within it the clients whose hash `h`
(Kafka's murmur2 of the clientId's key, the hash the producer's partitioner used, made positive)
falls in the `s % per_partition`-th of `per_partition` equal parts of 0..2**31-1: the high bits of
the hash pick the part, the partitioner used the low ones (`h % partitions`), so clients spread
evenly over the parts. Consecutive slots are adjacent hash ranges of one partition, then the next
partition's, so a range of slots (what a worker owns) is whole partitions plus at most a hash
range at each end.

With one slot per partition a slot is its partition, as before hash ranges existed: the same
slot numbers, the same transactional identities, the same costs. A consumer needs more only
when it may run more workers than its topic has partitions (`for_workers`).

`SlotRouter` is the per-record step: which slot a record of a partition belongs to, from its key
alone (the value is not parsed), cached per key so a record of another worker's slot costs a
dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from keyrange.ranges.slots import murmur2

HASH_SPACE = 1 << 31
"""Positive murmur2 hashes are 0..HASH_SPACE-1 (the partitioner's `murmur2(key) & 0x7fffffff`)."""
MAX_ROUTED_KEYS = 200_000
"""Keys a router remembers the slot of; it forgets them all past this (memory stays bounded)."""


@dataclass(frozen=True, slots=True)
class SlotLayout:
    """`partitions` partitions, each cut into `per_partition` hash-range slots (module docstring)."""

    partitions: int
    per_partition: int = 1

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"a slot layout needs at least one partition, got {self.partitions}")
        if self.per_partition < 1:
            raise ValueError(f"a slot layout needs at least one slot per partition, got {self.per_partition}")

    @classmethod
    def for_workers(cls, partitions: int, max_workers: int) -> SlotLayout:
        """The fewest slots per partition that give each of `max_workers` workers at least one slot:
        one per partition when the topic has at least as many partitions as workers."""
        return cls(partitions, max(1, -(-max_workers // partitions)))

    @classmethod
    def whole_partitions(cls, slots: Iterable[int]) -> SlotLayout:
        """One slot per partition, with partitions enough to hold `slots` (where no layout is given)."""
        return cls(max(slots, default=0) + 1)

    @classmethod
    def of_slot_count(cls, partitions: int, slot_count: int) -> SlotLayout:
        """The layout of a range map over `slot_count` slots on a topic of `partitions` partitions;
        ValueError, naming the fix, when the topic's partitions changed since the map was made."""
        if slot_count < partitions or slot_count % partitions:
            raise ValueError(
                f"the range map has {slot_count} slots, which is not a whole number of slots for each of "
                f"the topic's {partitions} partitions (were partitions added to the topic?); delete the "
                "consumer's control topic and committed offsets, or use a new groupId, to lay it out again")
        return cls(partitions, slot_count // partitions)

    @property
    def slot_count(self) -> int:
        """Slots are 0..slot_count-1."""
        return self.partitions * self.per_partition

    @property
    def splits_partitions(self) -> bool:
        """Whether a slot is less than a whole partition."""
        return self.per_partition > 1

    def partition_of(self, slot: int) -> int:
        """The partition a slot lies in."""
        self._check(slot)
        return slot // self.per_partition

    def slots_of_partition(self, partition: int) -> range:
        """The slots of a partition, in hash order."""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} does not exist: the layout has {self.partitions} partitions")
        first = partition * self.per_partition
        return range(first, first + self.per_partition)

    def hash_range(self, slot: int) -> tuple[int, int]:
        """The positive murmur2 hashes `lo <= h < hi` of the slot's clients within its partition."""
        self._check(slot)
        part = slot % self.per_partition
        return _bound(part, self.per_partition), _bound(part + 1, self.per_partition)

    def slot_for_hash(self, partition: int, positive_hash: int) -> int:
        """The slot of partition `partition` that holds a client whose positive murmur2 hash is this."""
        return partition * self.per_partition + (positive_hash * self.per_partition >> 31)

    def slot_for_key(self, partition: int, key: bytes) -> int:
        """The slot of a record of `partition` keyed by `key` (the clientId's UTF-8 text)."""
        return self.slot_for_hash(partition, murmur2(key) & 0x7FFFFFFF)

    def describe_slot(self, slot: int) -> str:
        """A slot as people read it: `3` for a whole partition, `3:1/4` for the second quarter of
        partition 3's hash range."""
        partition = self.partition_of(slot)
        if not self.splits_partitions:
            return str(partition)
        return f"{partition}:{slot % self.per_partition}/{self.per_partition}"

    def describe_range(self, first: int, last: int) -> str:
        """Slots first..last (a worker's range) as people read them: partitions where the range holds
        them whole (`0-5`, `3`), else the partition and the parts of its hash range (`0:0-1/4`: the
        first two quarters of partition 0; `0:2/4-1:1/4`: from partition 0's third quarter to
        partition 1's second, both included)."""
        if not first <= last:
            raise ValueError(f"a slot range needs first <= last, got {first}-{last}")
        per = self.per_partition
        p, q = self.partition_of(first), self.partition_of(last)
        if first % per == 0 and last % per == per - 1:
            return str(p) if p == q else f"{p}-{q}"
        if p == q:
            parts = str(first % per) if first == last else f"{first % per}-{last % per}"
            return f"{p}:{parts}/{per}"
        return f"{self.describe_slot(first)}-{self.describe_slot(last)}"

    def describe_slots(self, slots: Iterable[int]) -> str:
        """Any set of slots (what a worker reports holding) as `describe_range`s of its runs, joined
        by commas (`0:0-1/4,2`); empty for none."""
        runs: list[list[int]] = []
        for s in sorted(set(slots)):
            if runs and s == runs[-1][1] + 1:
                runs[-1][1] = s
            else:
                runs.append([s, s])
        return ",".join(self.describe_range(a, b) for a, b in runs)

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.slot_count:
            raise ValueError(f"slot {slot} does not exist: the layout has {self.slot_count} slots "
                             f"({self.partitions} partitions x {self.per_partition})")


def slot_of_label(text: str) -> int:
    """The slot a `describe_slot` text names (`3`, or `3:1/4` = slot 13): what the worker's metrics
    carry in their `partition` label. ValueError when it is neither."""
    partition, sep, rest = text.partition(":")
    if not sep:
        return int(partition)
    part, _, parts = rest.partition("/")
    p, b, n = int(partition), int(part), int(parts)
    if not 0 <= b < n:
        raise ValueError(f"bad slot label {text!r}: part {b} of {n}")
    return p * n + b


def _bound(part: int, parts: int) -> int:
    # The smallest h with h * parts >> 31 == part: slot_for_hash and hash_range agree exactly.
    return -(-part * HASH_SPACE // parts)


class SlotRouter:
    """Which slot a record belongs to, from its partition and key; remembers each key's part."""

    __slots__ = ("_layout", "_parts")

    def __init__(self, layout: SlotLayout) -> None:
        self._layout = layout
        self._parts: dict[bytes, int] = {}

    @property
    def layout(self) -> SlotLayout:
        """The layout it routes by."""
        return self._layout

    def __len__(self) -> int:
        """Keys it remembers the slot of (at most MAX_ROUTED_KEYS)."""
        return len(self._parts)

    @property
    def known_parts(self) -> Mapping[bytes, int]:
        """Key -> its `part_of`, for the keys remembered: a batch's loop looks a key up here and
        calls `part_of` only for a key it does not find (worker/routing.py)."""
        return self._parts

    def slot_of(self, partition: int, key: bytes | None) -> int:
        """The slot of a record of `partition` with `key` (a record without a key: the partition's
        first slot, where its dead letter belongs as any other record's would)."""
        per = self._layout.per_partition
        if per == 1:
            return partition
        return partition * per + self.part_of(key)

    def part_of(self, key: bytes | None) -> int:
        """Which of its partition's hash ranges a record keyed `key` belongs to (slot % per_partition;
        0 without a key), remembered for the key."""
        if key is None:
            return 0
        part = self._parts.get(key)
        if part is None:
            if len(self._parts) >= MAX_ROUTED_KEYS:
                self._parts.clear()
            part = self._parts[key] = (murmur2(key) & 0x7FFFFFFF) * self._layout.per_partition >> 31
        return part
