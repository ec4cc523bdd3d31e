"""The per-partition commit window (Decaton's OutOfOrderCommitControl).

Events of one partition finish out of order (different clients run in parallel), but an offset
may only be committed when it and every offset below it are finished. The window keeps the
fetched, unfinished offsets in fetch order; the committable offset is the lowest unfinished one,
or the offset after the last fetched record when all are finished. Each operation is O(1)
amortized: finishing marks an offset, and the front is popped while it is marked.
"""

from __future__ import annotations

from collections import deque


class CommitWindow:
    """Tracks fetched offsets of one partition and which of them are finished."""

    __slots__ = ("_done", "_next_offset", "_offsets", "_timestamps")

    def __init__(self, start_offset: int) -> None:
        self._offsets: deque[int] = deque()
        self._timestamps: deque[int] = deque()
        self._done: set[int] = set()
        self._next_offset = start_offset

    def add(self, offset: int, timestamp_ms: int = 0) -> None:
        """Record a fetched offset (strictly increasing; gaps such as transaction markers are fine)."""
        if offset < self._next_offset:
            raise ValueError(f"offset {offset} was added out of order (next expected >= {self._next_offset})")
        self._offsets.append(offset)
        self._timestamps.append(timestamp_ms)
        self._next_offset = offset + 1

    def finish(self, offset: int) -> None:
        """Mark a fetched offset finished (handled, dead-lettered, or dropped as a duplicate)."""
        offsets = self._offsets
        if offsets and offsets[0] == offset:
            offsets.popleft()
            self._timestamps.popleft()
            done = self._done
            while offsets and offsets[0] in done:
                done.remove(offsets.popleft())
                self._timestamps.popleft()
        else:
            self._done.add(offset)

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
    def oldest_timestamp_ms(self) -> int | None:
        """Record timestamp of the lowest unfinished offset, or None when all are finished."""
        return self._timestamps[0] if self._timestamps else None
