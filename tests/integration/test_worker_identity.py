"""Two processes that both run one worker id: `keyrange run`'s worker 0 and a second `keyrange
worker --worker-id 0` started by hand (what a force-deleted pod still running beside its
replacement looks like). Before, they fenced each other's slot producers forever ("acquiring 0-3
again: their producer failed", dozens of times a minute), both running handler calls. Now the
older process stands down with an error saying why; the supervisor restarts its worker 0, which
is then the newest claim, and the hand-started one stands down, exits 2 and says why. Nothing is
lost or handled twice meanwhile."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from keyrange.loadgen import LoadShape
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file
from tests.checkers import check_all
from tests.conftest import BrokerUnderTest
from tests.kafkatools import read_counts, read_input_log, read_processed

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: identity}}
spec:
  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: 4}}
  handler: ledger
  handlerConfig: {{delayMs: 1}}
  dedup: {{ttlSeconds: 60}}
  workers: {{min: 1, max: 1}}
"""
REACQUIRED = "again: their producer failed"


def _wait_for(condition, timeout_seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_a_second_process_with_the_same_worker_id_stands_down_with_a_clear_error(
        broker_engine: BrokerUnderTest, topic_name: str, tmp_path: Path) -> None:
    bootstrap = broker_engine.bootstrap
    path = tmp_path / "consumer.yaml"
    path.write_text(SPEC.format(topic=topic_name))
    supervisor = Supervisor(load_file(path), path, bootstrap, tmp_path / "run", tick_seconds=0.5, spare_workers=0)
    stop, totals = threading.Event(), LoadTotals()
    supervisor.start()
    assert supervisor.controller is not None and supervisor.fleet is not None
    controller, fleet = supervisor.controller, supervisor.fleet

    def tick() -> None:
        while not stop.wait(0.5):
            supervisor.tick()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    shape = LoadShape(rate=300, clients=50, duplicate_ratio=0.05, ledger=True, seed=3)
    load = threading.Thread(target=produce_phases,
                            args=(bootstrap, topic_name, shape, [Phase(20, 300)], stop, totals), daemon=True)
    rogue_log = tmp_path / "rogue.log"
    rogue = None
    try:
        _wait_for(lambda: 0 in controller.channel.state.reports and controller.channel.state.reports[0].held,
                  60, "worker 0 to hold its slots")
        load.start()
        time.sleep(2)  # the load flows through worker 0 first
        with rogue_log.open("wb") as out:
            rogue = subprocess.Popen(
                [sys.executable, "-m", "keyrange.cli", "worker", "--spec-file", str(path), "--bootstrap", bootstrap,
                 "--worker-id", "0"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # Within seconds one stands down for good: worker 0 of the supervisor, restarted, keeps it.
        code = rogue.wait(timeout=60)
        load.join(timeout=120)
        assert not load.is_alive()
        log = read_input_log(bootstrap, topic_name, totals.sent)
        distinct = len({e.uuid for e in log})
        processed = read_processed(bootstrap, f"{topic_name}.processed", distinct, timeout_seconds=120)
        counts = read_counts(bootstrap, topic_name, f"{topic_name}-g", covering=len(log))
    finally:
        stop.set()
        if rogue is not None and rogue.poll() is None:
            rogue.kill()
        ticker.join(timeout=10)
        supervisor.stop()
    output = rogue_log.read_text(errors="replace")
    assert code == 2, output[-3000:]
    assert "keyrange worker: error: worker 0 of group" in output and "claimed by another process" in output, \
        output[-3000:]
    worker_output = fleet.worker_log(0).read_text(errors="replace")
    assert "claimed by another process" in worker_output  # the first to stand down was the older one
    reacquires = worker_output.count(REACQUIRED) + output.count(REACQUIRED)
    assert reacquires <= 2, f"{reacquires} re-acquires: the two processes kept fencing each other"
    check_all(log, list(processed), counts, ledger=True)
    assert len(processed) == distinct
