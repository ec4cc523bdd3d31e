"""Fetch stalls: a partition the worker holds, with records past where it reads, that the consumer
has stopped fetching. librdkafka can leave a partition waiting in one of its fetch states after
the broker restarts or its leader changes (docs/kafka.md); nothing reports it, and without this
the slot would show lag and nothing pending until the worker restarts. The engine feeds
`FetchStalls` each gauge tick and assigns a stalled partition again from where its slots read
(`Worker._refetch`).

A partition counts as stalled when for `STALL_SECONDS` none of its held slots is paused or has
anything pending, and its log end is past the consumer's position (which passes a transactional
input's commit markers, never returned as records), without where they read moving.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

STALL_SECONDS = 20.0
"""How long a partition may have records to fetch and nothing in flight before its fetch counts as
stalled: far above a fetch's wait (20 ms) or a broker's answer to a busy machine (seconds)."""
LONGEST_STALL_SECONDS = 600.0
"""The wait before each further refetch of a partition that stays stalled doubles up to this."""


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """What the engine sees of one held partition's fetch at a tick."""

    reading: int
    """The offset its slots read next (the lowest of them)."""
    position: int
    """The consumer's position in it (at least `reading`)."""
    log_end: int
    """Its log end as last known (-1: unknown)."""
    idle: bool
    """None of its slots paused for backpressure, released, or with anything pending."""


@dataclass(slots=True)
class _Watch:
    since: float
    """When the partition was first seen idle at `offset`."""
    offset: int
    """Where its slots read next then."""
    due: float
    """When it is fetched afresh if it stays so."""
    wait: float
    """The wait that ends at `due`: STALL_SECONDS, doubled after each refetch."""
    refetches: int = 0
    """How often it was fetched afresh at this offset."""


@dataclass(frozen=True, slots=True)
class Stall:
    """A partition to fetch afresh: it read nothing past `offset` for `seconds`, though its log
    ends at `log_end`; `refetches` earlier refetches at this offset did not help."""

    partition: int
    offset: int
    log_end: int
    seconds: float
    refetches: int

    def describe(self) -> str:
        again = f"; {self.refetches} refetches at this offset did not help" if self.refetches else ""
        return (f"partition {self.partition} fetched nothing past offset {self.offset} for {self.seconds:.0f} s though "
                f"its log ends at {self.log_end}, with nothing pending and not paused{again}")


class FetchStalls:
    """Which partitions' fetch stalled, from what the engine observes each tick (pure; injected clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, stall_seconds: float | None = None) -> None:
        self._clock = clock
        self._stall_seconds = STALL_SECONDS if stall_seconds is None else stall_seconds
        self._watches: dict[int, _Watch] = {}

    def observe(self, partitions: Mapping[int, PartitionFetch]) -> list[Stall]:
        """Take each held partition's fetch and return the partitions to fetch afresh now. One that
        stays stalled is fetched afresh again after twice the wait, up to LONGEST_STALL_SECONDS."""
        now = self._clock()
        for gone in self._watches.keys() - partitions.keys():
            del self._watches[gone]
        stalls = []
        for p, fetch in partitions.items():
            offset, log_end = fetch.reading, fetch.log_end
            watch = self._watches.get(p)
            if not fetch.idle or log_end <= fetch.position:
                self._watches.pop(p, None)
            elif watch is None or watch.offset != offset:
                self._watches[p] = _Watch(now, offset, now + self._stall_seconds, self._stall_seconds)
            elif now >= watch.due:
                stalls.append(Stall(p, offset, log_end, now - watch.since, watch.refetches))
                watch.wait = min(watch.wait * 2, LONGEST_STALL_SECONDS)
                watch.due = now + watch.wait
                watch.refetches += 1
        return stalls
