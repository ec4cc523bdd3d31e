"""A TTL set of event uuids: constant time per event, memory bounded by rate x TTL.

Entries sit in one `set` for membership and in time buckets (a deque of lists) for expiry, so
expiring is popping whole buckets from the front rather than scanning. An entry lives between
`ttl_seconds` and `ttl_seconds + bucket_seconds` (the bucket width is a small share of the TTL),
which only ever errs towards dropping a duplicate a little later than the TTL, never earlier.
A dict keyed by uuid with an expiry per entry would cost ~60 more bytes per entry.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

BUCKETS_PER_TTL = 50
"""Expiry granularity: the TTL is cut into this many buckets (2% overshoot at most)."""


class TtlSet:
    """Remembers strings for `ttl_seconds` after they were added, by an injected monotonic clock."""

    __slots__ = ("_bucket_seconds", "_buckets", "_clock", "_members", "ttl_seconds")

    def __init__(self, ttl_seconds: float, clock: Callable[[], float]) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
        self.ttl_seconds = ttl_seconds
        self._bucket_seconds = ttl_seconds / BUCKETS_PER_TTL
        self._clock = clock
        self._members: set[str] = set()
        # (bucket index, members added in it), oldest first; a bucket index is time // width.
        self._buckets: deque[tuple[int, list[str]]] = deque()

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def add_if_new(self, key: str) -> bool:
        """Add `key` and return True, or return False if it is already remembered."""
        self.expire()
        if key in self._members:
            return False
        self._remember(key, self._clock())
        return True

    def add_seen_at(self, key: str, seen_at: float) -> None:
        """Remember `key` as if added at `seen_at` (clock units); used to rebuild from the log.

        Keys must be added in roughly increasing `seen_at`; an older one joins the current
        newest bucket (it then lives a little longer, never shorter).
        """
        if seen_at + self.ttl_seconds <= self._clock() or key in self._members:
            return
        self._remember(key, seen_at)

    def expire(self) -> None:
        """Forget every bucket older than the TTL."""
        horizon = int((self._clock() - self.ttl_seconds) // self._bucket_seconds)
        buckets = self._buckets
        members = self._members
        while buckets and buckets[0][0] < horizon:
            for key in buckets.popleft()[1]:
                members.discard(key)

    def _remember(self, key: str, at: float) -> None:
        index = int(at // self._bucket_seconds)
        buckets = self._buckets
        if buckets and buckets[-1][0] >= index:
            buckets[-1][1].append(key)
        else:
            buckets.append((index, [key]))
        self._members.add(key)
