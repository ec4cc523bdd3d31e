"""What a run's rescales did, from its processed records and the controller's record of rescales.

Pure functions over plain values, shared by `keyrange demo`'s report and the benchmarks: the pause
of each handoff (as `keyrange_handoff_pause_seconds` measures it, ranges/pauses.py), flaps, and
the time from a burst's start to the size it needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

from keyrange.worker.stats import percentiles


class RescaleTimes(Protocol):
    """What is needed of a rescale (controller.Rescale has it)."""

    moved_slots: frozenset[int]
    published_ms: int
    """When the epoch that put the moved slots in transit was published."""
    settled_ms: int | None
    """When the grant was published (None: the handoff did not complete)."""


def first_starts(processed: Iterable[Mapping[str, Any]],
                 slot_of: Callable[[Mapping[str, Any]], int]) -> dict[int, list[tuple[int, int]]]:
    """Per slot, its processed records' (startedAt, created), in start order."""
    by_slot: dict[int, list[tuple[int, int]]] = {}
    for r in processed:
        by_slot.setdefault(slot_of(r), []).append((int(r["startedAt"]), int(r["created"])))
    for starts in by_slot.values():
        starts.sort()
    return by_slot


def handoff_pauses(starts: Mapping[int, Sequence[tuple[int, int]]], rescale: RescaleTimes,
                   until_ms: int | None = None) -> list[float]:
    """The pause of each moved slot of `rescale` in seconds, as the new owner's metric measures it:
    (its first event started after the grant) - max(the transit's publication, that event's
    `created`). A slot with no event after the grant (before `until_ms`, the next rescale) has none."""
    if rescale.settled_ms is None:
        return []
    pauses = []
    for slot in sorted(rescale.moved_slots):
        first = next(((s, c) for s, c in starts.get(slot, ()) if s >= rescale.settled_ms), None)
        if first is None or (until_ms is not None and first[0] >= until_ms):
            continue
        started, created = first
        pauses.append(max(0, started - max(rescale.published_ms, created)) / 1000)
    return pauses


def flaps(sizes: Sequence[int], offered: Sequence[float] | None = None) -> int:
    """Turns from shrinking back to growing in a sequence of worker counts (2 -> 1 -> 2 is one).
    With `offered` (the offered events/s when each size was decided), a split that answers a rise of
    the offered load since the merge is not one: the size followed the load, it did not oscillate."""
    rates = list(offered) if offered is not None else [0.0] * len(sizes)
    if len(rates) != len(sizes):
        raise ValueError(f"{len(sizes)} sizes but {len(rates)} offered rates")
    moves = [(b - a, rate) for (a, b), rate in zip(pairwise(sizes), rates[1:], strict=True) if b != a]
    return sum(1 for (earlier, merged_at), (later, split_at) in pairwise(moves)
               if earlier < 0 < later and split_at <= merged_at)


@dataclass(frozen=True)
class SizeChange:
    """A rescale, as the report lists it."""

    at_ms: int
    """When it was decided (epoch ms)."""
    workers_after: int


def time_to_size(changes: Sequence[SizeChange], burst_ms: int, needed: int) -> float | None:
    """Seconds from `burst_ms` to the first decision at or after it that reached `needed` workers
    (0 when the size was reached before the burst and kept); None if it never was."""
    size_at_burst = 0
    for change in changes:
        if change.at_ms < burst_ms:
            size_at_burst = change.workers_after
        elif change.workers_after >= needed:
            return (change.at_ms - burst_ms) / 1000
    return 0.0 if size_at_burst >= needed else None


def describe_pauses(pauses: Sequence[float]) -> str:
    """One handoff's pauses in a report line: the largest, and how many moved slots it covers."""
    if not pauses:
        return "pause not measured (no event of a moved range after the grant)"
    return f"pause {max(pauses):.2f} s (largest of {len(pauses)} moved range(s))"


def needed_workers(rate: float, concurrency: int, handler_ms: float, max_workers: int,
                   utilization: float) -> int:
    """The workers a `rate` of events needs when each worker runs `concurrency` handler calls of
    `handler_ms` at once and may be `utilization` busy (the target planner's sizing), within `max_workers`."""
    per_worker = concurrency * 1000 / handler_ms
    return max(1, min(max_workers, math.ceil(rate / (per_worker * utilization))))


@dataclass(frozen=True)
class ScalingSummary:
    """How a run with a burst was sized: the figures a report states about its rescales."""

    burst_rate: float
    """Events/s of the burst."""
    burst_at_s: float
    """When the burst began, seconds after the load began."""
    needed_workers: int
    """The size the burst needs (needed_workers)."""
    time_to_size_seconds: float | None
    """From the burst's start to the decision that reached the needed size; None: never reached."""
    splits: int
    merges: int
    flaps: int
    """Splits after a merge without a rise of the offered load between them (flaps)."""
    read_ahead_waits: int
    """Handoffs that waited out the read-ahead's timeout."""
    pauses: tuple[float, ...]
    """Every measured moved range's pause, seconds."""
    quiet_latency_ms: dict[str, float]
    """Latency percentiles of the events created after the burst."""


def summary_lines(s: ScalingSummary) -> list[str]:
    """The report's lines about sizing, decisions, flaps, pauses and the quiet phase's latency."""
    if s.time_to_size_seconds is None:
        reached = "never reached"
    else:
        reached = f"reached {s.time_to_size_seconds:.1f} s after the burst began"
    if s.pauses:
        p50, p99, top = percentiles(list(s.pauses), 0.5, 0.99, 1.0)
        pause_line = (f"- handoff pauses: {len(s.pauses)} moved range(s), p50 {p50:.2f} s, p99 {p99:.2f} s, "
                      f"max {top:.2f} s")
    else:
        pause_line = "- handoff pauses: none measured"
    quiet = "  ".join(f"{k} {v:,.0f} ms" for k, v in s.quiet_latency_ms.items() if k in ("p50", "p99", "max"))
    return [
        f"- time to size: the burst ({s.burst_rate:,.0f} events/s from +{s.burst_at_s:.0f} s) needs "
        f"{s.needed_workers} workers: {reached}",
        f"- scale decisions: {s.splits + s.merges} ({s.splits} split, {s.merges} merge); flaps (a split after a "
        f"merge, the offered load not risen): {s.flaps}; handoffs that waited out the read-ahead timeout: "
        f"{s.read_ahead_waits}",
        pause_line,
        f"- latency of the events created after the burst: {quiet or 'no events'}",
    ]
