"""Scale reaction time: from lag crossing lagHighRecords to the new owner handling its first event.

Through the alert path (real Prometheus and Alertmanager: scrape and evaluation every 1 s, the
lag-high alert's default `for: 2s`, `group_wait: 0s`, then the webhook, the controller's split, a
new worker process, its restore and first event), side by side in the same run with the same path
at the earlier default `for: 5s` and with the baseline: `keyrange run` without Alertmanager, where
the planner reads the workers' lag itself every second.

Lag is created by producing 1000 events/s into a `sleep` consumer that handles ~400/s. The crossing
time is when worker 0's own `keyrange_consumer_lag` (summed over its partitions, the series the
alert reads) first exceeds the threshold, polled every 100 ms; the end is the earliest `startedAt`
of a processed record from worker 1. Goal <= 5 s (issue 30; KEDA's default loop is >= 45 s).

    python -m benchmarks.bench_scale_reaction [--quick]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import load_average, row, running_broker, ticking
from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase, produce_phases
from keyrange.local.monitoring import AlertingOptions
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file

LAG_HIGH_RECORDS = 500
GOAL_SECONDS = 5.0
PREVIOUS_FOR_SECONDS = 5.0
"""The lag-high alert's `for:` before issue 30 (the default is AlertingOptions' own)."""
TOKEN = "bench-token"


def _spec(path: Path, topic: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer", "metadata": {"name": "reaction"},
        "spec": {
            "kafka": {"topic": topic, "partitions": 8},
            "handler": "sleep", "handlerConfig": {"meanMs": 10, "stddevMs": 1},
            "concurrency": 4, "maxPending": 100_000,
            "workers": {"min": 1, "max": 2},
            # Only the records threshold can fire: the seconds one is out of reach here.
            "scaling": {"lagHighRecords": LAG_HIGH_RECORDS, "lagHighSeconds": 3600, "lagLowRecords": 10,
                        "cooldownSeconds": 300, "policy": "step"},
        },
    }))
    return path


def _worker_lag(url: str) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "keyrange_consumer_lag")


def _first_event_of(bootstrap: str, topic: str, worker: str, deadline: float) -> int:
    """The earliest startedAt (epoch ms) of a processed record from `worker`."""
    from tests.kafkatools import read_processed

    while time.monotonic() < deadline:
        try:
            records = read_processed(bootstrap, topic, timeout_seconds=30)
        except AssertionError:
            continue  # not read to the end in time (a busy machine): read again until the deadline
        started = [r["startedAt"] for r in records if str(r["worker"]) == worker]
        if started:
            return int(min(started))
        time.sleep(0.5)
    raise TimeoutError(f"worker {worker} handled no event before the deadline")


MODES: dict[str, AlertingOptions | None] = {
    "alerts": AlertingOptions(0, TOKEN),
    "alerts-previous": AlertingOptions(0, TOKEN, lag_high_for_seconds=PREVIOUS_FOR_SECONDS),
    "planner": None,
}
"""Measured side by side: the alert path at the default `for:` and at the previous one, the planner."""


def measure(mode: str, workdir: Path, engine: str = "tansu") -> dict[str, float]:
    """One run: seconds from the crossing to the decision and to the new owner's first event."""
    from tests.integration.prometheus.stack import PrometheusStack

    with running_broker(engine) as bootstrap:
        topic = f"reaction-{mode}-{time.time_ns()}"
        spec_file = _spec(workdir / "consumer.yaml", topic)
        options = MODES[mode]
        sup = Supervisor(load_file(spec_file), spec_file, bootstrap, workdir / "run", alerting=options)
        with ticking(sup) as stop:
            stack = None
            try:
                assert sup.fleet is not None and sup.controller is not None
                if sup.alerts is not None:
                    rules = yaml.safe_load(sup.alerts.rules_file.read_text())
                    stack = PrometheusStack(workdir / "prom", rules, sup.alerts.webhook_url, TOKEN,
                                            targets_file=sup.alerts.targets_file).start()
                    # Worker 1 is the standby process: it may or may not be scraped yet.
                    _wait(lambda: len(stack.query('up{consumer="reaction",worker="0"} == 1')) == 1, 60)
                else:
                    _wait(lambda: _worker_lag(sup.fleet.urls()[0]) is not None, 60)  # type: ignore[union-attr]
                load = threading.Thread(target=produce_phases, daemon=True, args=(
                    bootstrap, topic, LoadShape(rate=1000, duplicate_ratio=0.0, seed=1), [Phase(90, 1000)], stop))
                load.start()
                url = sup.fleet.urls()[0]
                crossed_ms = 0
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    lag = _worker_lag(url)
                    if lag is not None and lag > LAG_HIGH_RECORDS:
                        crossed_ms = int(time.time() * 1000)
                        break
                    time.sleep(0.1)
                assert crossed_ms, "lag never crossed the threshold"
                _wait(lambda: bool(sup.controller.rescales), 90)  # type: ignore[union-attr]
                decided_ms = sup.controller.rescales[0].decided_ms
                first_ms = _first_event_of(bootstrap, sup.consumer.spec.sink_topic, "1", time.monotonic() + 90)
                return {"decision_s": (decided_ms - crossed_ms) / 1000, "reaction_s": (first_ms - crossed_ms) / 1000}
            finally:
                if stack is not None:
                    stack.stop()


def _wait(condition: Any, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark setup timed out")
        time.sleep(0.2)


def run(quick: bool, brokers: tuple[str, ...] = ("tansu",)) -> list[dict[str, Any]]:
    """Rows for BENCHMARKS.md on each broker: the alert path and the direct-planner baseline, medians of N runs."""
    rows: list[dict[str, Any]] = []
    for engine in brokers:
        rows += [{**r, "broker": engine} for r in run_on(quick, engine)]
    return rows


def run_on(quick: bool, engine: str) -> list[dict[str, Any]]:
    """The rows on one broker (a fresh one per measured run)."""
    repeats = 1 if quick else 3
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    loads = []
    for _ in range(repeats):
        for mode in MODES:
            loads.append(load_average())
            with tempfile.TemporaryDirectory(prefix="keyrange-bench-") as tmp:
                try:
                    results[mode].append(measure(mode, Path(tmp), engine))
                except Exception:
                    kept = Path(tempfile.mkdtemp(prefix=f"keyrange-bench-{mode}-failed-"))
                    shutil.copytree(Path(tmp) / "run" / "logs", kept / "logs", dirs_exist_ok=True)
                    print(f"{mode} on {engine} failed; its workers' logs: {kept / 'logs'}", file=sys.stderr)
                    raise

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    runs = f"median of {repeats} run(s)"
    default_for = MODES["alerts"].lag_high_for_seconds  # type: ignore[union-attr]
    return [
        row(f"scale reaction: lag crossing -> new owner's first event, via Prometheus + Alertmanager "
            f"(for: {default_for:g}s)", round(median("alerts", "reaction_s"), 2), "s", f"<= {GOAL_SECONDS:g} s",
            round(median("planner", "reaction_s"), 2),
            "baseline: the planner reading lag directly (keyrange run without Alertmanager); scrape/eval 1 s; "
            f"{runs}; all runs: {[r['reaction_s'] for r in results['alerts']]}; "
            f"direct: {[r['reaction_s'] for r in results['planner']]}; {loads}"),
        row(f"scale reaction via alerts at the previous for: {PREVIOUS_FOR_SECONDS:g}s",
            round(median("alerts-previous", "reaction_s"), 2), "s", None, round(median("alerts", "reaction_s"), 2),
            f"baseline: the same path at for: {default_for:g}s; "
            f"all runs: {[r['reaction_s'] for r in results['alerts-previous']]}"),
        row("scale reaction: lag crossing -> split decision, via Prometheus + Alertmanager",
            round(median("alerts", "decision_s"), 2), "s", None, round(median("planner", "decision_s"), 2),
            "the rest of the reaction is the new worker process starting, restoring and acquiring"),
    ]


if __name__ == "__main__":
    from benchmarks.harness import quick_from_command_line

    for result in run(quick=quick_from_command_line("benchmarks.bench_scale_reaction", __doc__)):
        print(result)
