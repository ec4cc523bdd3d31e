"""The live table of `keyrange run`: pure formatting of what the supervisor measured.

Ranges show as partitions (`0-5`), or, where a partition's clients are cut into hash ranges, as
parts of them (`0:0-1/4`, the first two quarters of partition 0: SlotLayout.describe_range).
"""

from __future__ import annotations

from collections.abc import Sequence
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
    lag: SlotLag
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


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"


def render(name: str, status: ControllerStatus, rows: Sequence[WorkerRow], totals: Totals,
           now_ms: int) -> str:
    """The table as text (no terminal control codes)."""
    lag_records = sum(x.records for x in status.range_lag)
    lag_seconds = max((x.seconds for x in status.range_lag), default=0.0)
    lines = [
        f"keyrange run {name}: {totals.elapsed_seconds:,.0f} s, epoch {status.epoch}, "
        f"{status.map.workers} workers",
        f"  handled {totals.processed:,} ({totals.rate:,.0f}/s)   p99 latency {_ms(totals.p99_latency_seconds)}   "
        f"lag {lag_records:,} records / {lag_seconds:.1f} s   duplicates dropped {totals.duplicates:,}   "
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
            f"{row.lag.records:>9,} {row.lag.seconds:>7.1f} {row.restarts:>8}{mark}"
        )
    return "\n".join(lines)
