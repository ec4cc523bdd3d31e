"""The Spark part of `keyrange demo`'s report: run the aggregation once, read its Parquet back.

After the load, the demo aggregates the processed topic with the same job as `keyrange aggregate`
(local[2]) and adds what the tables say to its report: per-worker events and handler time, the
per-minute windows, the busiest clients, and a cross-check that the aggregation counted exactly
the distinct processed uuids the demo counted itself from the topic.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from keyrange.aggregation import AggregateResults, SparkSetupError, read_results, run_once
from keyrange.aggregation.processed_stream import PYTHON_SOURCE
from keyrange.errors import UserError

if TYPE_CHECKING:
    from keyrange.aggregation import AggregationSummary

MASTER = "local[2]"
TOP_CLIENTS = 10
"""Clients listed in the report, busiest first."""


@dataclass(frozen=True)
class AggregationSection:
    """What the report shows from the aggregates, and the cross-check against the demo's count."""

    output: str
    summary: str
    """The job's one-line summary (batches, records read, aggregated, duplicates)."""
    seconds: float
    """Wall time of the job, Spark's start included."""
    workers: list[dict[str, Any]]
    """worker, events, handler_ms_mean."""
    windows: list[dict[str, Any]]
    """window_start_ms, events, latency_p50_ms, latency_p99_ms."""
    top_clients: list[dict[str, Any]]
    """client_id, events (the busiest first)."""
    aggregated_events: dict[str, int]
    """Events summed over each table (clients, windows, workers); all equal when the job is right."""
    distinct_processed: int
    """Distinct uuids the demo read from the processed topic itself."""
    error: str | None = None
    """Why the job failed (then every table is empty)."""

    @property
    def matches(self) -> bool:
        """True if every table's event count equals the demo's own count of processed uuids."""
        return self.error is None and all(n == self.distinct_processed for n in self.aggregated_events.values())


def aggregate(bootstrap: str, topic: str, output: Path, distinct_processed: int,
              out: TextIO) -> tuple[AggregationSection | None, str]:
    """Aggregate `topic` into `output` (replacing an earlier demo's) and build the report section.

    Returns (section, "") or, after one line saying so, (None, why) when pyspark, pyarrow or Java
    is missing.
    """
    # The embedded broker is in memory: an earlier demo's checkpoint holds offsets of a topic
    # that no longer exists, and its records would be counted with this run's.
    shutil.rmtree(output, ignore_errors=True)
    print(f"keyrange demo: aggregating {topic} with Spark ({MASTER}) into {output}/ ...", file=out, flush=True)
    began = time.monotonic()
    try:
        # tansu workaround: the embedded broker's ListOffsets answers 0 while a worker's transaction is open, which
        # Spark's connector cannot tell from an empty topic: keyrange's reader consumes to the end.
        summary = run_once(bootstrap, topic, str(output), master=MASTER, source=PYTHON_SOURCE)
    except SparkSetupError as exc:
        print(f"keyrange demo: no Spark aggregation in the report: {exc}", file=out, flush=True)
        return None, str(exc)
    except UserError as exc:  # the job's AggregationError (its module needs pyspark to import)
        print(f"keyrange demo: the Spark aggregation failed: {exc}", file=out, flush=True)
        return AggregationSection(str(output), "", time.monotonic() - began, [], [], [], {}, distinct_processed,
                                  error=str(exc)), ""
    print(f"keyrange demo: aggregated in {time.monotonic() - began:.0f} s: {summary.line()}", file=out, flush=True)
    return build_section(summary, read_results(str(output)), distinct_processed, time.monotonic() - began), ""


def build_section(summary: AggregationSummary, results: AggregateResults, distinct_processed: int,
                  seconds: float) -> AggregationSection:
    """The report section from the job's summary and its Parquet tables."""
    busiest = sorted(results.clients, key=lambda c: (-c["events"], c["client_id"]))[:TOP_CLIENTS]
    return AggregationSection(
        output=summary.output,
        summary=summary.line(),
        seconds=seconds,
        workers=[{k: w[k] for k in ("worker", "events", "handler_ms_mean")} for w in results.workers],
        windows=[{k: w[k] for k in ("window_start_ms", "events", "latency_p50_ms", "latency_p99_ms")}
                 for w in results.windows],
        top_clients=[{"client_id": c["client_id"], "events": c["events"]} for c in busiest],
        aggregated_events={name: sum(row["events"] for row in rows) for name, rows in
                           (("clients", results.clients), ("windows", results.windows),
                            ("workers", results.workers))},
        distinct_processed=distinct_processed,
    )


def render_section(section: AggregationSection | None, skipped: str) -> list[str]:
    """The report's "Spark aggregation" section as Markdown lines (`skipped` says why when None)."""
    lines = ["## Spark aggregation", ""]
    if section is None:
        return [*lines, f"Skipped: {skipped}", ""]
    if section.error is not None:
        return [*lines, f"FAILED: {section.error}", ""]
    counts = section.aggregated_events
    verdict = "OK" if section.matches else "MISMATCH"
    lines += [
        f"The job of `keyrange aggregate --once --source {PYTHON_SOURCE}` over the processed topic "
        f"({MASTER}, {section.seconds:.0f} s, Spark's start included): {section.summary}",
        "",
        f"- cross-check: {verdict}: events aggregated {_counts(counts)}; distinct processed uuids counted by "
        f"the demo {section.distinct_processed:,}",
        "",
        "| worker | events | mean handler time |",
        "|---|---:|---:|",
        *(f"| {w['worker']} | {w['events']:,} | {_ms(w['handler_ms_mean'])} |" for w in section.workers),
        "",
        "| minute (UTC) | events | latency p50 | latency p99 |",
        "|---|---:|---:|---:|",
        *(f"| {time.strftime('%H:%M', time.gmtime(w['window_start_ms'] / 1000))} | {w['events']:,} | "
          f"{_ms(w['latency_p50_ms'])} | {_ms(w['latency_p99_ms'])} |" for w in section.windows),
        "",
        "Busiest clients: " + ", ".join(f"{c['client_id']} ({c['events']:,})" for c in section.top_clients),
        "",
    ]
    return lines


def _counts(counts: dict[str, int]) -> str:
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values())):,}"
    return "(" + ", ".join(f"{name} {n:,}" for name, n in counts.items()) + ")"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"
