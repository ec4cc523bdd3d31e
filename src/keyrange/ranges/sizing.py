"""Target sizing (pure): how many workers the measured load needs, and the range map that spreads it.

The model follows the Flink Kubernetes operator's autoscaler: a worker's true capacity is what it
handled divided by how busy it was (`rate / busy`), and the load to carry is the input rate plus
the backlog to drain within `lagHighSeconds`. Busy is the larger of two fractions, both measured
over the same window: the handler permits in use (handler seconds per second / concurrency) and
the worker process's CPU (seconds per second; one Python process runs on about one core). A
worker falling behind (its oldest unfinished event older than `BEHIND_SECONDS`, its slots' input
outgrowing what it handles, and at least `BEHIND_BUSY` busy) already runs as fast as it can, so
its capacity is what it handled, whatever its busy fractions say (a machine whose cores other
processes share). Lag says nothing about capacity otherwise: old lag that does not grow is what a
handoff's pause left behind, and a mostly idle worker whose events wait is waiting on something
more workers would not speed up (a restore, a slow broker).

Slots are the unit of placement, so a size is only enough when the contiguous ranges of that many
workers each carry at most a worker's capacity (`fewest_workers`), not merely when the total fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol, runtime_checkable

from keyrange.ranges.rangemap import Assignment, RangeMap, SlotRange

MIN_BUSY = 0.05
"""Below this busy fraction a worker's `rate / busy` is noise: it gives no estimate."""
BEHIND_SECONDS = 1.0
"""A worker whose oldest unfinished event is older than this may be falling behind ..."""
BEHIND_GROWTH = 1.05
"""... when its slots' input exceeds what it handles by this factor (its lag grows) ..."""
BEHIND_BUSY = 0.5
"""... and it is at least this busy."""


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's measurements over the trailing window."""

    processed_per_second: float
    """Events it handled per second."""
    permits_busy: float
    """Fraction of its handler permits in use (handler seconds per second / concurrency)."""
    cpu_busy: float = 0.0
    """Fraction of one core its process used."""

    @property
    def busy(self) -> float:
        """How busy the worker was: the larger of its permits' and its CPU's fraction, at most 1."""
        return min(1.0, max(self.permits_busy, self.cpu_busy))


@dataclass(frozen=True)
class Load:
    """What the controller measured over a trailing window (the sizing's input)."""

    slot_rates: Mapping[int, float]
    """Input events per second of each slot (handled rate plus the growth of its lag)."""
    workers: Mapping[int, WorkerLoad]
    """Per worker ordinal, once it warmed up."""
    warming: frozenset[int] = frozenset()
    """Workers that started too recently for their rates to say what they can handle."""


@runtime_checkable
class LoadSource(Protocol):
    """A lag source that also measures the load (the controller passes it to the planner)."""

    def load(self) -> Load | None:
        """The load over the trailing window, or None before there is one."""
        ...


def falling_behind(load: WorkerLoad, lag_seconds: float, input_per_second: float) -> bool:
    """Whether a worker runs at its limit: old unfinished events, an input that outgrows it, and busy."""
    return (lag_seconds > BEHIND_SECONDS and input_per_second > load.processed_per_second * BEHIND_GROWTH
            and load.busy >= BEHIND_BUSY)


def worker_capacity(load: WorkerLoad, behind: bool) -> float | None:
    """Events per second this worker could handle, or None when its measurement says nothing."""
    if load.processed_per_second <= 0:
        return None
    if behind:
        return load.processed_per_second
    if load.busy < MIN_BUSY:
        return None
    return load.processed_per_second / load.busy


def fleet_capacity(estimates: Sequence[float | None]) -> float | None:
    """One worker's capacity: the largest of the workers' estimates, or None. They run the same code
    on the same kind of machine: one that shows less is held back by something that passes (a
    restore, a process start, a core another process took), and sizing on it would overshoot."""
    known = [e for e in estimates if e is not None]
    return max(known) if known else None


def slot_demand(rate: float, backlog_records: int, drain_seconds: float) -> float:
    """Events per second a slot needs: its input rate plus its backlog drained within `drain_seconds`."""
    return max(0.0, rate) + max(0, backlog_records) / drain_seconds


def balanced_cuts(demand: Sequence[float], parts: int) -> list[int]:
    """Cut points (range starts after the first) of `parts` contiguous non-empty runs of `demand`
    minimizing the largest run's demand, then the largest run's slot count."""
    n = len(demand)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} slots into {parts} ranges")
    prefix = [0.0]
    for d in demand:
        prefix.append(prefix[-1] + d)
    worst = (float("inf"), n + 1)
    # best[k][i]: the best (max demand, max size) of slots 0..i-1 in k runs; cut[k][i]: the last run's start.
    best = [[worst] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0.0, 0)
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                prev = best[k - 1][j]
                run = (prefix[i] - prefix[j], i - j)
                # Rounded, so float noise in the sums does not decide between equal loads.
                cost = (round(max(prev[0], run[0]), 9), max(prev[1], run[1]))
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    cuts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        cuts.append(i)
    return sorted(cuts)[1:]


def runs_needed(demand: Sequence[float], limit: float) -> int | None:
    """The fewest contiguous runs of `demand` that each need at most `limit` (greedy, which is exact
    for contiguous runs), or None when one slot alone needs more."""
    runs, total = 1, 0.0
    for d in demand:
        if d > limit:
            return None
        if total + d > limit:
            runs, total = runs + 1, 0.0
        total += d
    return runs


def fewest_workers(demand: Sequence[float], capacity: float, utilization: float, low: int, high: int) -> int:
    """The fewest workers in low..high whose ranges can each need at most `utilization` of `capacity`,
    or, where one slot alone needs more, at most that slot's demand (more workers would not help it:
    it gets a range of its own, the rest are packed as usual)."""
    runs = runs_needed(demand, max(capacity * utilization, max(demand, default=0.0)))
    return max(low, min(high, runs or high))


def balanced_map(current: RangeMap, demand: Sequence[float], workers: int) -> RangeMap:
    """The map of `workers` balanced ranges, owned so that the fewest slots change owner: each range
    keeps the current owner it overlaps most (ordinals 0..workers-1 only: a merge frees the top)."""
    starts = [0, *balanced_cuts(demand, workers), current.slot_count]
    ranges = [SlotRange(a, b - 1) for a, b in pairwise(starts)]
    # Greedy by overlap, ties to the lower ordinal and range, so even maps keep their order.
    overlap = sorted(
        ((-sum(1 for s in r.slots if current.owner_of(s) == w), w, i)
         for i, r in enumerate(ranges) for w in range(workers)),
    )
    owner: dict[int, int] = {}
    taken: set[int] = set()
    for shared, w, i in overlap:
        if shared and i not in owner and w not in taken:
            owner[i] = w
            taken.add(w)
    spare = iter(w for w in range(workers) if w not in taken)
    assignments = tuple(Assignment(r, owner[i] if i in owner else next(spare)) for i, r in enumerate(ranges))
    return RangeMap(current.epoch + 1, current.slot_count, assignments)
