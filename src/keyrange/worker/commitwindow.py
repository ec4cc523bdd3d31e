"""The per-slot commit window (Decaton's OutOfOrderCommitControl).

Events of one slot finish out of order (different clients run in parallel), but an offset
may only be committed when it and every offset below it are finished. The window keeps the
fetched, unfinished offsets in fetch order; the committable offset is the lowest unfinished one,
or the offset after the last fetched record when all are finished. Each operation is O(1)
amortized: finishing marks an offset, and the front is popped while it is marked.

Each offset finishes with an outcome (handled, dead-lettered, dropped as a duplicate), and the
window counts outcomes only as the committable offset passes them: those counts describe exactly
the offsets a commit covers, so they can be committed with it and never count an offset twice
when a slot moves before its offset committed (the new owner finishes it again).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import IntEnum


class Outcome(IntEnum):
    """How an offset finished."""

    HANDLED = 0
    """The handler ran and its processed record was written."""
    DEAD_LETTERED = 1
    """Bad input, or a handler that kept failing: the record went to the dead-letter topic."""
    DUPLICATE = 2
    """Its uuid was in the dedup window: dropped."""


@dataclass(frozen=True, slots=True)
class Totals:
    """How the offsets of a slot below some offset finished, counted once each."""

    handled: int = 0
    dead_lettered: int = 0
    duplicates_dropped: int = 0

    def plus(self, counts: list[int]) -> Totals:
        """These totals with `counts` (indexed by Outcome) added."""
        return Totals(self.handled + counts[Outcome.HANDLED], self.dead_lettered + counts[Outcome.DEAD_LETTERED],
                      self.duplicates_dropped + counts[Outcome.DUPLICATE])


class CommitWindow:
    """Tracks fetched offsets of one slot and which of them are finished."""

    __slots__ = ("_done", "_next_offset", "_offsets", "_sizes", "_timestamps", "passed", "pending_bytes")

    def __init__(self, start_offset: int) -> None:
        self._offsets: deque[int] = deque()
        self._timestamps: deque[int] = deque()
        self._sizes: deque[int] = deque()
        self.pending_bytes = 0
        """Bytes (record values) of the pending offsets: what the window holds in memory."""
        self._done: dict[int, Outcome] = {}
        self._next_offset = start_offset
        self.passed = [0, 0, 0]
        """Outcomes of the offsets the committable offset has passed, indexed by Outcome."""

    def add(self, offset: int, timestamp_ms: int = 0, size_bytes: int = 0) -> None:
        """Record a fetched offset (strictly increasing; gaps such as transaction markers are fine)."""
        if offset < self._next_offset:
            raise ValueError(f"offset {offset} was added out of order (next expected >= {self._next_offset})")
        self._offsets.append(offset)
        self._timestamps.append(timestamp_ms)
        self._sizes.append(size_bytes)
        self.pending_bytes += size_bytes
        self._next_offset = offset + 1

    def pass_offset(self, offset: int) -> None:
        """An offset of the partition that is not this window's (another slot's record of the same
        partition: layout.py): the committable offset may move past it. O(1), nothing kept."""
        if offset >= self._next_offset:
            self._next_offset = offset + 1

    def finish(self, offset: int, outcome: Outcome) -> None:
        """Mark a fetched offset finished with `outcome`."""
        offsets = self._offsets
        if offsets and offsets[0] == offset:
            offsets.popleft()
            self._timestamps.popleft()
            self.pending_bytes -= self._sizes.popleft()
            passed = self.passed
            passed[outcome] += 1
            done = self._done
            while offsets and offsets[0] in done:
                passed[done.pop(offsets.popleft())] += 1
                self._timestamps.popleft()
                self.pending_bytes -= self._sizes.popleft()
        else:
            self._done[offset] = outcome

    @property
    def committable(self) -> int:
        """The offset to commit: the lowest unfinished one, or the next to fetch."""
        return self._offsets[0] if self._offsets else self._next_offset

    @property
    def next_offset(self) -> int:
        """The offset after the last fetched one (where fetching continues)."""
        return self._next_offset

    @property
    def pending(self) -> int:
        """Fetched offsets not yet committable (the unfinished ones and those behind them)."""
        return len(self._offsets)

    @property
    def finished_ahead(self) -> int:
        """Offsets finished behind an unfinished one (committable once it finishes)."""
        return len(self._done)

    @property
    def oldest_timestamp_ms(self) -> int | None:
        """Record timestamp of the lowest unfinished offset, or None when all are finished."""
        return self._timestamps[0] if self._timestamps else None
