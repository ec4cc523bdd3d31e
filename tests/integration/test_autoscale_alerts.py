"""Prometheus -> Alertmanager -> the webhook receiver -> a controller, with the real binaries.

The workers here are metrics endpoints this test controls (the same metric names and labels the
worker exports), so every alert can be driven on purpose: lag high splits once per episode and
cooldown, lag low merges after the cooldown and never while the consumer is hot, a worker that
disappears is reported, and Alertmanager's repeated notifications never rescale twice. The full
loop with real workers and ranges is tests/integration/test_autoscale_e2e.py.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from keyrange.autoscale.receiver import AlertReceiver, ScaleDecision
from keyrange.autoscale.rules import RuleOptions, render_rule_groups
from keyrange.autoscale.tracker import ConsumerRef
from keyrange.local.monitoring import ReceiverServer
from keyrange.local.ports import free_port
from keyrange.ranges.planner import Direction, ScaleOutcome
from keyrange.spec import parse_spec
from tests.integration.prometheus.stack import PrometheusStack

CONSUMER = ConsumerRef("default", "payments")
COOLDOWN_SECONDS = 12.0
SPEC = parse_spec({
    "kafka": {"topic": "events"},
    "workers": {"min": 1, "max": 4},
    "scaling": {"lagHighRecords": 1000, "lagHighSeconds": 30, "lagLowRecords": 50,
                "cooldownSeconds": COOLDOWN_SECONDS},
})


class FakeWorker:
    """A /metrics endpoint exporting the worker's lag gauges for two partitions."""

    def __init__(self, worker: int) -> None:
        self.worker = str(worker)
        self.registry = CollectorRegistry()
        labels = ["consumer", "worker", "partition"]
        self.lag = Gauge("keyrange_consumer_lag", "records behind", labels, registry=self.registry)
        self.lag_seconds = Gauge("keyrange_consumer_lag_seconds", "oldest unfinished", labels,
                                 registry=self.registry)
        self.port = free_port()
        self.server, _ = start_http_server(self.port, "127.0.0.1", self.registry)

    def set_lag(self, records: int) -> None:
        for partition in (2 * int(self.worker), 2 * int(self.worker) + 1):
            self.lag.labels(CONSUMER.name, self.worker, str(partition)).set(records / 2)
            self.lag_seconds.labels(CONSUMER.name, self.worker, str(partition)).set(0.2)

    def target(self) -> tuple[str, dict[str, str]]:
        return f"127.0.0.1:{self.port}", {"consumer": CONSUMER.name, "worker": self.worker}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RecordingController:
    """Applies every request; remembers when, so the test can check the spacing."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Direction, str]] = []
        self.lock = threading.Lock()

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        with self.lock:
            self.calls.append((time.monotonic(), direction, reason))
        return ScaleOutcome(True, f"{direction} applied", 1, 2 if direction == "up" else 1)

    def directions(self) -> list[Direction]:
        with self.lock:
            return [d for _, d, _ in self.calls]


def wait_for(condition: Callable[[], bool], what: str, timeout_seconds: float = 90.0) -> None:
    """Poll `condition` until true; fail naming `what` (generous: 2 shared cores)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")


@pytest.fixture
def workers() -> Iterator[list[FakeWorker]]:
    ws = [FakeWorker(0), FakeWorker(1)]
    yield ws
    for w in ws:
        w.stop()


@pytest.mark.slow
def test_alerts_scale_through_prometheus_and_alertmanager(tmp_path: Path, workers: list[FakeWorker]) -> None:
    controller = RecordingController()
    decisions: list[ScaleDecision] = []
    receiver = AlertReceiver("t0ken", on_decision=decisions.append)
    receiver.register(CONSUMER, controller, COOLDOWN_SECONDS)
    rules = render_rule_groups(CONSUMER.name, CONSUMER.namespace, SPEC, RuleOptions(
        lag_high_for_seconds=1, worker_down_for_seconds=2, match_namespace=False))
    for w in workers:
        w.set_lag(500)  # between lagLowRecords and lagHighRecords: nothing fires
    with ReceiverServer(receiver) as server, \
            PrometheusStack(tmp_path, rules, server.url, "t0ken", repeat_interval="2s") as stack:
        stack.set_targets([w.target() for w in workers])
        wait_for(lambda: len(stack.query("keyrange_consumer_lag")) == 4, "both workers scraped")

        workers[0].set_lag(5000)
        wait_for(lambda: controller.directions() == ["up"], "a split requested by the lag-high alert")
        assert "KeyrangeLagHighRecords(worker 0)" in controller.calls[0][2]
        # Alertmanager repeats the firing alert every 2 s; none of that rescales again.
        wait_for(lambda: receiver.verdicts["repeat"] >= 2, "repeated notifications of the firing alert")
        assert controller.directions().count("up") <= 1 + int(
            (time.monotonic() - controller.calls[0][0]) // COOLDOWN_SECONDS)

        for w in workers:
            w.set_lag(10)
        wait_for(lambda: receiver.verdicts["resolved"] >= 1, "the lag-high alert resolving")
        wait_for(lambda: "down" in controller.directions(), "a merge requested by the lag-low alert")
        ups = [t for t, d, _ in controller.calls if d == "up"]
        first_down = next(t for t, d, _ in controller.calls if d == "down")
        assert first_down - ups[-1] >= COOLDOWN_SECONDS * 0.9, "merged within the cooldown of a split"
        # The receiver records a decision once the controller's call has returned, on its own thread.
        wait_for(lambda: len(decisions) >= len(controller.calls), "the receiver recording its last decision")
        assert [(d.consumer, d.applied) for d in decisions] == [(CONSUMER, True)] * len(controller.calls)

        # Repeated requests of one direction are spaced by at least the cooldown.
        for direction in ("up", "down"):
            times = [t for t, d, _ in controller.calls if d == direction]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert all(gap >= COOLDOWN_SECONDS * 0.9 for gap in gaps), (direction, gaps)

        workers[1].stop()
        wait_for(lambda: receiver.verdicts["noted"] >= 1, "the worker-down alert reaching the receiver")
        firing = {a["labels"]["alertname"] for a in stack.alerts() if a["state"] == "firing"}
        assert "KeyrangeWorkerDown" in firing
