"""`keyrange demo`: its report's Spark aggregation section and the cross-check behind its exit code.

The end-to-end test runs the real command (its own embedded broker, worker processes, Spark
local[2]) with every load phase cut to a few seconds by the hidden `--phase-seconds`, on the broker
it starts by default wherever it can run at all (Spark needs Java): Apache Kafka. The others check
the section's cross-check and the no-Spark path without starting anything.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keyrange.aggregation import AggregateResults, AggregationSummary, SparkSetupError
from keyrange.local import demo_aggregation
from keyrange.local.demo import DemoReport, render_report
from keyrange.local.demo_aggregation import aggregate, build_section, render_section
from tests.integration.aggregation_helpers import require_pyspark


@pytest.mark.slow
@pytest.mark.timeout(420)  # ~100 s alone; Spark's start alone took over a minute on a busy 2-core machine
def test_demo_report_has_the_aggregation_and_it_counts_every_processed_uuid_once(tmp_path: Path) -> None:
    require_pyspark()
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "keyrange.cli", "demo", "--quick", "--phase-seconds", "3", "--out", str(out),
         "--engine", "kafka"],
        capture_output=True, text=True, timeout=400,
        env={**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("keyrange demo: embedded broker: Apache Kafka, one KRaft node (--engine kafka: ")
    assert f"keyrange demo: aggregating demo-events.processed with Spark (local[2]) into {out / 'aggregates'}/" \
        in proc.stdout

    report = json.loads((out / "report.json").read_text())
    assert report["lost"] == 0 and report["handled_twice"] == 0
    # 2 partitions for workers.max 4: each partition's key space is cut into 2 hash ranges.
    assert report["key_space"]["partitions"] == 2 and report["key_space"]["per_partition"] == 2
    assert sorted(report["key_space"]["owners"]) == ["0:0/2", "0:1/2", "1:0/2", "1:1/2"]
    section = report["aggregation"]
    handled = report["handled"]
    assert handled > 0
    assert section["error"] is None
    assert section["distinct_processed"] == handled
    assert section["aggregated_events"] == {"clients": handled, "windows": handled, "workers": handled}
    assert section["workers"] and all(w["events"] > 0 and w["handler_ms_mean"] > 0 for w in section["workers"])
    assert section["windows"] and all(w["latency_p99_ms"] >= w["latency_p50_ms"] for w in section["windows"])
    top = [c["events"] for c in section["top_clients"]]
    assert len(top) == demo_aggregation.TOP_CLIENTS and top == sorted(top, reverse=True)

    md = (out / "report.md").read_text()
    assert "## Key space" in md and "- partition 1: 2 hash ranges over " in md
    # What the run's scaling did, stated whatever it was (short phases may not rescale at all).
    scaling = report["scaling"]
    assert scaling["needed_workers"] == 4 and scaling["burst_rate"] == 1000
    assert f"- time to size: the burst (1,000 events/s from +{scaling['burst_at_s']:.0f} s) needs 4 workers: " in md
    assert f"- scale decisions: {scaling['splits'] + scaling['merges']} ({scaling['splits']} split, " \
        f"{scaling['merges']} merge); flaps (a split after a merge, the offered load not risen): " \
        f"{scaling['flaps']}; handoffs that waited out the read-ahead timeout: {scaling['read_ahead_waits']}" in md
    assert "- handoff pauses: " in md and "- latency of the events created after the burst: " in md
    assert len(report["rescales"]) == scaling["splits"] + scaling["merges"]
    assert all(", pause " in line for line in md.splitlines() if " workers, epoch " in line)
    assert "## Spark aggregation" in md
    assert f"cross-check: OK: events aggregated {handled:,}; distinct processed uuids counted by the demo " \
        f"{handled:,}" in md
    assert (out / "aggregates" / "_latest.json").exists()


def _results(events_per_worker: dict[str, int], client_events: int | None = None) -> AggregateResults:
    total = sum(events_per_worker.values())
    return AggregateResults(
        clients=[{"client_id": 1, "events": (client_events or total) - 1}, {"client_id": 2, "events": 1}],
        windows=[{"window_start_ms": 60_000, "window_end_ms": 120_000, "events": total,
                  "latency_p50_ms": 3.0, "latency_p95_ms": 8.0, "latency_p99_ms": 9.5}],
        workers=[{"worker": w, "events": n, "handler_ms_mean": 10.2, "handler_ms_total": 10.2 * n}
                 for w, n in events_per_worker.items()],
    )


def _report(**changes: object) -> DemoReport:
    base = dict(produced=100, duplicates_sent=1, handled=99, duplicates_dropped=1, lost=0, handled_twice=0,
                handled_twice_beyond_ttl=0, latency_ms={"p50": 3.0}, rescales=[], max_workers=1, seconds=10.0)
    return DemoReport(**{**base, **changes})  # type: ignore[arg-type]


def test_the_cross_check_fails_when_the_aggregation_counts_differently(tmp_path: Path) -> None:
    summary = AggregationSummary(str(tmp_path), batches=1, records_read=99, aggregated=99)
    right = build_section(summary, _results({"worker-0": 60, "worker-1": 39}), 99, 7.0)
    assert right.matches and not _report(aggregation=right).aggregation_mismatch
    assert "cross-check: OK: events aggregated 99;" in "\n".join(render_section(right, ""))
    assert right.top_clients == [{"client_id": 1, "events": 98}, {"client_id": 2, "events": 1}]

    short = build_section(summary, _results({"worker-0": 60, "worker-1": 38}), 99, 7.0)
    assert not short.matches and _report(aggregation=short).aggregation_mismatch
    assert "cross-check: MISMATCH: events aggregated 98; distinct processed uuids counted by the demo 99" \
        in "\n".join(render_section(short, ""))

    torn = build_section(summary, _results({"worker-0": 60, "worker-1": 39}, client_events=98), 99, 7.0)
    assert not torn.matches and _report(aggregation=torn).aggregation_mismatch
    assert "cross-check: MISMATCH: events aggregated (clients 98, windows 99, workers 99);" \
        in "\n".join(render_section(torn, ""))


def test_without_spark_the_demo_says_so_in_one_line_and_the_report_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*args: object, **kwargs: object) -> None:
        raise SparkSetupError("Java is not installed (Spark needs Java 17 or 21)")

    monkeypatch.setattr(demo_aggregation, "run_once", missing)
    stale = tmp_path / "aggregates" / "_checkpoint"
    stale.mkdir(parents=True)
    out = io.StringIO()
    section, why = aggregate("127.0.0.1:1", "t.processed", tmp_path / "aggregates", 99, out)
    assert section is None and why == "Java is not installed (Spark needs Java 17 or 21)"
    lines = out.getvalue().splitlines()
    assert lines[-1] == ("keyrange demo: no Spark aggregation in the report: "
                         "Java is not installed (Spark needs Java 17 or 21)")
    assert not stale.exists()  # an earlier demo's checkpoint never carries over to a new broker

    report = _report(aggregation_skipped=why)
    assert not report.aggregation_mismatch
    assert f"## Spark aggregation\n\nSkipped: {why}\n" in render_report(report, tmp_path)


def test_an_out_folder_that_cannot_be_made_stops_the_demo_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "demo"
    proc = subprocess.run([sys.executable, "-m", "keyrange.cli", "demo", "--out", str(out), "--quick"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"keyrange demo: error: --out {out}: cannot make the folder (Not a directory); " \
                                  "pick another --out"
    assert proc.stdout == ""  # no broker was announced or started
