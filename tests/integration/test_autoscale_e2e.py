"""The whole alert loop on the real broker, real workers, real Prometheus and Alertmanager.

`keyrange run`'s supervisor in alert mode (`--webhook-port`): its planner's own lag triggers are
off, so every rescale here was caused by an alert. A ledger burst (order-sensitive, 100 clients,
duplicates) outruns one worker; Prometheus scrapes the workers, KeyrangeLagHigh* fires,
Alertmanager posts it, the receiver asks the controller, a range splits and lag falls; the alert
resolves, the quiet load keeps every range under lagLowRecords, KeyrangeLagLow fires after the
cooldown and the ranges merge back. Then: no event lost, none handled twice, per-client order and
every ledger result equal to a sequential oracle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyrange.loadgen import LoadShape
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.monitoring import AlertingOptions
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file
from tests.checkers import check_all
from tests.integration.prometheus.stack import PrometheusStack
from tests.kafkatools import read_counts, read_input_log, read_processed

COOLDOWN_SECONDS = 8
TOKEN = "e2e-token"


@pytest.fixture
def bootstrap(any_bootstrap: str) -> str:
    """The test runs on tansu and on Apache Kafka (tests/conftest.py's `broker_engine`)."""
    return any_bootstrap


def write_spec(path: Path, topic: str) -> Path:
    """A ledger consumer slow enough (2 handler calls in flight, 5 ms each) that a 700/s burst needs
    a second worker, and fast enough that two catch up."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
        "metadata": {"name": "ledger-e2e"},
        "spec": {
            "kafka": {"topic": topic, "partitions": 8},
            "handler": "ledger", "handlerConfig": {"delayMs": 5},
            "concurrency": 2, "maxPending": 5000,
            "workers": {"min": 1, "max": 3},
            "scaling": {"lagHighRecords": 800, "lagHighSeconds": 4, "lagLowRecords": 50,
                        "cooldownSeconds": COOLDOWN_SECONDS},
        },
    }))
    return path


def wait_for(condition: Callable[[], bool], what: str, timeout_seconds: float) -> None:
    """Poll until true; fail naming `what` (generous deadlines: 2 shared cores)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")


@pytest.fixture
def supervisor(tmp_path: Path, bootstrap: str, topic_name: str) -> Iterator[Supervisor]:
    spec_file = write_spec(tmp_path / "consumer.yaml", topic_name)
    sup = Supervisor(load_file(spec_file), spec_file, bootstrap, tmp_path / "run",
                     alerting=AlertingOptions(0, TOKEN, lag_high_for_seconds=2))
    stop = threading.Event()
    failures: list[BaseException] = []

    def ticking() -> None:  # what `keyrange run`'s main loop does
        try:
            while not stop.wait(sup.tick_seconds):
                sup.tick()
        except BaseException as exc:
            failures.append(exc)
            raise

    sup.start()
    ticker = threading.Thread(target=ticking, daemon=True)
    ticker.start()
    yield sup
    stop.set()
    ticker.join(10)
    sup.stop()
    assert not failures, f"the supervisor's tick failed: {failures[0]!r}"


@pytest.mark.slow
def test_alerts_split_under_a_burst_and_merge_back_without_breaking_a_guarantee(
        tmp_path: Path, bootstrap: str, supervisor: Supervisor) -> None:
    alerts = supervisor.alerts
    assert alerts is not None and supervisor.controller is not None
    rules = yaml.safe_load(alerts.rules_file.read_text())
    topic = supervisor.consumer.spec.kafka.topic
    with PrometheusStack(tmp_path / "prom", rules, alerts.webhook_url, TOKEN, repeat_interval="5s",
                         targets_file=alerts.targets_file) as stack:
        # Worker 1 is `keyrange run`'s standby process: it may or may not be scraped yet.
        wait_for(lambda: len(stack.query('up{consumer="ledger-e2e",worker="0"} == 1')) == 1, "worker 0 scraped", 60)
        stop, totals = threading.Event(), LoadTotals()
        shape = LoadShape(rate=700, clients=100, ledger=True, duplicate_ratio=0.02, seed=7)
        phases = [Phase(12, 700), Phase(40, 30)]
        load = threading.Thread(target=produce_phases, args=(bootstrap, topic, shape, phases, stop, totals))
        load.start()
        try:
            wait_for(lambda: any(d.direction == "up" and d.applied for d in alerts.decisions),
                     "a split caused by a lag-high alert", 90)
            wait_for(lambda: supervisor.status().map.workers >= 2 and not supervisor.status().handoff_awaiting,
                     "the split's handoff to settle", 90)
            wait_for(lambda: any(d.direction == "down" and d.applied for d in alerts.decisions),
                     "a merge caused by the lag-low alert", 150)
            wait_for(lambda: supervisor.status().map.workers == 1 and not supervisor.status().handoff_awaiting,
                     "the ranges to merge back to one worker", 150)
        finally:
            stop.set()
            load.join(60)
        assert alerts.receiver.verdicts["resolved"] >= 1, "the lag-high alert never resolved"

    actions = [r.action for r in supervisor.controller.rescales]
    assert "split" in actions and "merge" in actions, actions
    assert all(d.reason.startswith("alert ") for d in alerts.decisions)

    log = read_input_log(bootstrap, topic, expect=totals.sent)
    distinct = len({e.uuid for e in log})
    processed: list[Any] = []

    def all_handled() -> bool:
        processed[:] = read_processed(bootstrap, supervisor.consumer.spec.sink_topic, timeout_seconds=10)
        return len({r["uuid"] for r in processed}) >= distinct

    wait_for(all_handled, f"all {distinct} distinct events to be processed", 120)
    try:
        counts = read_counts(bootstrap, topic, supervisor.consumer.group_id, covering=len(log))
        check_all(log, processed, counts, ledger=True)
    except AssertionError:
        print(describe_duplicates(log, processed, supervisor))
        raise


def describe_duplicates(log: list[Any], processed: list[Any], supervisor: Supervisor) -> str:
    """Where each twice-handled uuid sits in the input and who handled it when (for diagnosis)."""
    counts: dict[str, list[Any]] = {}
    for r in processed:
        counts.setdefault(r["uuid"], []).append(r)
    lines = []
    where = {}
    for e in log:
        where.setdefault(e.uuid, []).append((e.partition, e.offset))
    for uuid, records in counts.items():
        if len(records) > 1:
            gap = (max(r["startedAt"] for r in records) - min(r["startedAt"] for r in records)) / 1000
            lines.append(f"{uuid} input at {where.get(uuid)}, handled {gap:.2f} s apart: " + "; ".join(
                f"worker {r['worker']} p{r['partition']}@{r['offset']} started {r['startedAt']}" for r in records))
    assert supervisor.controller is not None
    lines += [f"rescale {r}" for r in supervisor.controller.rescales]
    return "\n".join(lines[:40])
