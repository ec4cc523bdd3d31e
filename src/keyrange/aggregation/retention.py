"""How long the stored records are kept, and why a late re-delivery never counts twice.

The records table (`records/minute=<ms>/batch=<id>/`) is what deduplication checks a uuid against
and what a minute's percentiles are recomputed from, so it cannot simply grow forever, nor can a
minute be dropped while a re-delivery of one of its events may still arrive.

The rule works in event time, like a Spark watermark: the high-water mark is the newest `created`
aggregated so far (kept in `_latest.json`), and the horizon is the high-water mark minus the
retention period, rounded down to the start of its minute (so that it changes once a minute, not
at every micro-batch: a value in a query is compiled into Spark's generated code, and a new value
is new code to compile). At each micro-batch:
- a record whose `created` is older than the horizon, i.e. whose whole minute is, is late: it is
  not aggregated, only counted (`late` in the summary). Its minute's uuids may already be gone, so
  counting it could count a re-delivery twice; skipping it keeps "each uuid once" and leaves that
  minute's window final;
- a minute directory that lies wholly before the horizon is deleted: nothing can be added to it
  any more, and its window and the client and worker figures already hold its records.
The horizon of a micro-batch comes from the state before it, so a replayed batch decides the same.
A re-delivery repeats its original's `created` (workers re-run the same event), so with a period
well above the longest worker outage plus consumer lag (default one day) no re-delivery is late.
"""

from __future__ import annotations

from dataclasses import dataclass

from keyrange.aggregation.reference import MINUTE_MS
from keyrange.aggregation.store import RECORDS, HadoopStorage

DEFAULT_MINUTES = 24 * 60
"""Default retention period of the stored records: one day of event time."""


@dataclass(frozen=True)
class Retention:
    """The retention period; 0 keeps every record forever (and nothing is ever late)."""

    minutes: int = DEFAULT_MINUTES

    def __post_init__(self) -> None:
        if self.minutes < 0:
            raise ValueError(f"the retention period must be 0 (forever) or more minutes, got {self.minutes}")

    def horizon_ms(self, high_water_ms: int | None) -> int | None:
        """Records created before this are late, minutes wholly before it are deleted (None: none).

        A minute's start: a record is late exactly when its minute may be deleted."""
        if not self.minutes or high_water_ms is None:
            return None
        exact = high_water_ms - self.minutes * MINUTE_MS
        return exact - exact % MINUTE_MS

    @staticmethod
    def expired(minutes: list[int], horizon_ms: int | None) -> list[int]:
        """The stored minutes lying wholly before the horizon."""
        if horizon_ms is None:
            return []
        return [m for m in minutes if m + MINUTE_MS <= horizon_ms]

    def apply(self, storage: HadoopStorage, horizon_ms: int | None) -> list[int]:
        """Delete the expired minutes' records; the minutes deleted."""
        gone = self.expired(storage.record_minutes(), horizon_ms) if horizon_ms is not None else []
        for minute in gone:
            storage.delete(f"{RECORDS}/minute={minute}")
        return gone
