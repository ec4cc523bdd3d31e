"""The dedup window of one slot: uuids seen within a TTL, in event time.

The window's clock is the slot's stream time: the newest event time (`created`) seen, never
later than the wall clock (every step is capped, however small), so events from a producer whose
clock runs ahead can neither flush the window nor walk its clock ahead and keep it from expiring.
An event is remembered at the stream time just after it was seen, which is its own
`created` for a well-behaved stream (created times grow along the log) and bounds it both ways
otherwise: an event from the future enters at the wall clock (it cannot pin its entry, and every
entry after it, in the window forever), and one from a producer whose clock is behind enters at
the stream time it arrived at (it gets the full TTL instead of none). An entry is forgotten once
the stream time has moved more than `ttl_seconds` past it. A duplicate, dropped, renews its uuid's
entry: a uuid is dropped when any earlier copy came within the TTL. So the window depends only on
the uuids and times in the log, never on which copy was handled, and a restore that replays the
log rebuilds it exactly, however many copies a uuid has. Event time, not the time of handling,
makes dedup independent of lag, pauses, handoffs and restarts: a duplicate sent 5 s after its
original is dropped even if the slot was stalled for a minute in between, and the window
replayed from the log (in log order, restore.py) on another worker is the same window.

Entries sit in one dict (uuid -> the bucket of its latest copy) for membership and in time buckets
(a deque of lists) for expiry, so expiring is popping whole buckets from the front rather than
scanning: O(1) per event, memory bounded by the event rate x TTL (a renewed uuid sits in the
bucket of each copy until that bucket expires; only the latest one removes it). An entry lives
between `ttl_seconds` and `ttl_seconds + bucket width` (a small share of the TTL), which only ever
errs towards dropping a duplicate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

BUCKETS_PER_TTL = 50
"""Expiry granularity: the TTL is cut into this many buckets (2% overshoot at most)."""


def window_seconds(ttl_seconds: float) -> float:
    """The longest an entry stays, in stream time: the TTL and one bucket (a restore reads this far
    back from the stream time to rebuild the window)."""
    return ttl_seconds * (1 + 1 / BUCKETS_PER_TTL)


class TtlSet:
    """Remembers strings for `ttl_seconds` of stream time after their event time."""

    __slots__ = ("_bucket_seconds", "_buckets", "_members", "_wall_clock", "_wall_read", "stream_time", "ttl_seconds")

    def __init__(self, ttl_seconds: float, wall_clock: Callable[[], float]) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
        self.ttl_seconds = ttl_seconds
        self._bucket_seconds = ttl_seconds / BUCKETS_PER_TTL
        self._wall_clock = wall_clock
        # The latest reading of the wall clock: an event time at or below it needs no new reading.
        self._wall_read = float("-inf")
        self.stream_time = float("-inf")
        """The newest event time seen (seconds), capped at the wall clock."""
        self._members: dict[str, int] = {}
        """uuid -> the bucket index of its latest copy."""
        # (bucket index, members added in it), oldest first; a bucket index is time // width.
        self._buckets: deque[tuple[int, list[str]]] = deque()

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def add_if_new(self, key: str, event_time: float) -> bool:
        """Remember `key` seen with `event_time` (seconds) from now on; return True if it was not
        remembered already (a new event), False if it was (a duplicate: its entry is renewed)."""
        if event_time > self.stream_time:
            self._advance(event_time)
        # The stream time never goes back, so buckets are appended in order.
        index = int(self.stream_time // self._bucket_seconds)
        members = self._members
        before = members.get(key)
        if before == index:
            return False  # renewed within its bucket: nothing to move
        members[key] = index
        buckets = self._buckets
        if buckets and buckets[-1][0] == index:
            buckets[-1][1].append(key)
        else:
            buckets.append((index, [key]))
        return before is None

    def replay(self, key: str, event_time: float) -> None:
        """Add `key` as a restore replays the log before the committed offset (restore.py): as
        `add_if_new`, except that an event time past the wall clock does not move the stream time.
        Its owner bounded it by the wall clock when it saw it, which the log does not keep; that was
        no earlier than the stream time then, where it enters. (Bounding it by the clock now
        instead, a restore long after a partition's last event, stamped in the future, would move
        the clock past the whole window.)"""
        if event_time > self._wall_read:
            self._wall_read = self._wall_clock()
        # Past the wall clock: remembered at the stream time, which it does not move.
        self.add_if_new(key, event_time if event_time <= self._wall_read or self.stream_time == float("-inf")
                        else self.stream_time)

    def expire(self) -> None:
        """Forget every bucket older than the TTL (in stream time)."""
        if not self._buckets:
            return  # also: no event seen yet, the stream time is still -inf
        horizon = int((self.stream_time - self.ttl_seconds) // self._bucket_seconds)
        buckets = self._buckets
        members = self._members
        while buckets and buckets[0][0] < horizon:
            index, keys = buckets.popleft()
            for key in keys:
                if members.get(key) == index:  # not renewed by a later copy
                    del members[key]

    def _advance(self, event_time: float) -> None:
        # Every step is capped (small steps under a cap checked per jump would add up past the wall
        # clock); the clock is read only when an event passes its last reading.
        if event_time > self._wall_read:
            self._wall_read = self._wall_clock()
            if event_time > self._wall_read:
                event_time = self._wall_read
        if event_time > self.stream_time:
            self.stream_time = event_time
            self.expire()
