"""The live table of `keyrange run`: pure formatting of what the supervisor measured.

Ranges show as partitions (`0-5`), or, where a partition's clients are cut into hash ranges, as
parts of them (`0:0-1/4`, the first two quarters of partition 0: SlotLayout.describe_range).
Lag that no worker reports (a worker starting, restarting, or taking slots over) shows as `-`:
its backlog is unknown, not zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from keyrange.ranges.controller import ControllerStatus
from keyrange.ranges.planner import SlotLag


@dataclass(frozen=True)
class WorkerRow:
    """One worker's line."""

    ordinal: int
    alive: bool
    held: str
    """Slots the worker reports holding (control topic) as partitions and hash ranges, e.g. `0-5`
    or `0:2/4-1:1/4` (SlotLayout.describe_slots)."""
    rate: float
    """Events handled per second over the last window."""
    lag: SlotLag | None
    """Over its slots (`row_lag`); None while not every one of them is measured."""
    restarts: int


@dataclass(frozen=True)
class Totals:
    """The headline figures."""

    elapsed_seconds: float
    processed: int
    rate: float
    p99_latency_seconds: float | None
    duplicates: int
    dead_letters: int
    unmeasured_slots: int = 0
    """Slots of the range map whose lag no worker reports: the header's lag leaves them out."""


def row_lag(assigned: Iterable[int], reported: Mapping[int, SlotLag] | None) -> SlotLag | None:
    """A worker's lag over the slots the map assigns it, from its last scrape (`reported`, None when
    it did not answer); None unless every one of those slots is in it."""
    if reported is None:
        return None
    parts = []
    for slot in assigned:
        if slot not in reported:
            return None
        parts.append(reported[slot])
    return SlotLag(sum(p.records for p in parts), max((p.seconds for p in parts), default=0.0))


def _lag_headline(status: ControllerStatus, unmeasured: int) -> str:
    slots = status.map.slot_count
    if unmeasured >= slots:
        return "lag -"
    records = sum(x.records for x in status.range_lag)
    seconds = max((x.seconds for x in status.range_lag), default=0.0)
    text = f"lag {records:,} records / {seconds:.1f} s"
    return text + (f" ({unmeasured} of {slots} slots unmeasured)" if unmeasured else "")


def _lag_cells(lag: SlotLag | None) -> str:
    if lag is None:
        return f"{'-':>9} {'-':>7}"
    return f"{lag.records:>9,} {lag.seconds:>7.1f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"


def render(name: str, status: ControllerStatus, rows: Sequence[WorkerRow], totals: Totals,
           now_ms: int) -> str:
    """The table as text (no terminal control codes)."""
    lines = [
        f"keyrange run {name}: {totals.elapsed_seconds:,.0f} s, epoch {status.epoch}, "
        f"{status.map.workers} workers",
        f"  handled {totals.processed:,} ({totals.rate:,.0f}/s)   p99 latency {_ms(totals.p99_latency_seconds)}   "
        f"{_lag_headline(status, totals.unmeasured_slots)}   duplicates dropped {totals.duplicates:,}   "
        f"dead letters {totals.dead_letters:,}",
    ]
    if status.rescales:
        last = status.rescales[-1]
        ago = (now_ms - last.decided_ms) / 1000
        state = "done" if last.settled_ms is not None else "handing off"
        lines.append(f"  last rescale: {last.action} {ago:,.0f} s ago ({state}): {last.reason}"
                     f"   [{len(status.rescales)} rescales]")
    else:
        lines.append(f"  last rescale: none ({status.last_decision})")
    if status.handoff_awaiting:
        lines.append(f"  handoff waits for worker(s) {', '.join(map(str, sorted(status.handoff_awaiting)))}")
    elif status.starting:
        lines.append("  starting a worker for the next split")
    ranges = {a.worker: status.map.describe_range(a.range, status.layout) for a in status.map}
    # Hash ranges (`0:2/4-1:1/4`) are wider than partition numbers: the columns grow to fit them.
    wide = max((len(text) for text in (*ranges.values(), *(row.held for row in rows))), default=0)
    width = max(8, wide)
    lines.append(f"  {'worker':>6} {'range':>{width}} {'holds':>{width}} {'rate/s':>9} {'lag':>9} {'lag s':>7} "
                 f"{'restarts':>8}")
    for row in rows:
        mark = "" if row.alive else " (down)"
        lines.append(
            f"  {row.ordinal:>6} {ranges.get(row.ordinal, '-'):>{width}} {row.held or '-':>{width}} {row.rate:>9,.0f} "
            f"{_lag_cells(row.lag)} {row.restarts:>8}{mark}"
        )
    return "\n".join(lines)
