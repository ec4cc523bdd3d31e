"""`keyrange run`'s supervisor end to end: worker subprocesses, rescales, a SIGKILL mid-handoff.

The supervisor runs in this process against a session broker (the SIGKILL test on tansu and on
Apache Kafka); workers are real `keyrange worker` subprocesses in controlled mode. Rescales are
requested through `request_scale` (the alert webhook's entry point); twice, the old owner is
SIGKILLed while its handoff is pending, and the supervisor restarts it, it catches up from the
newest epoch, and the handoff completes.

The dedup TTL is 60 s here: a SIGKILL, a process restart and two restores on two shared cores can
pause a moved slot for longer than the default 10 s, and TTL dedup by design only drops a
duplicate while its original is remembered. This test is about the handoff, not TTL expiry.

The SIGKILL test runs each of the ledger's two paths on one broker: on Apache Kafka the ledger as it
ships (inline, run on the worker's loop as its event is admitted), on tansu queued (a coroutine that
sleeps 1 ms first, up to `concurrency` events at once). Both paths on both brokers would add two
40 s runs to the suite; the chaos seeds (test_handoff_random.py) draw either path on either broker.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyrange.handlers import load_handler
from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase
from keyrange.spec import load_file
from tests.conftest import BrokerUnderTest
from tests.integration.fault_run import INLINE, QUEUED
from tests.integration.supervised import check_everything, supervised, wait_for
from tests.kafkatools import read_processed

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: {name}}}
spec:
  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: 12}}
  handler: ledger
  handlerConfig: {handler_config}
  concurrency: 32
  dedup: {{ttlSeconds: 60}}
  workers: {{min: 1, max: 4}}
  scaling: {{lagHighRecords: 1000000000, lagHighSeconds: 100000, lagLowRecords: 0, cooldownSeconds: 0, policy: step}}
"""


@pytest.mark.slow
def test_run_rescales_and_survives_a_sigkill_mid_handoff(broker_engine: BrokerUnderTest, topic_name: str,
                                                         tmp_path: Path) -> None:
    bootstrap = broker_engine.bootstrap
    handler_config = INLINE if broker_engine.engine == "kafka" else QUEUED
    path = tmp_path / "consumer.yaml"
    path.write_text(SPEC.format(name="ledger-run", topic=topic_name, handler_config=handler_config))
    consumer = load_file(path)
    assert load_handler(consumer.spec.handler, consumer.spec.handler_config).inline == (handler_config == INLINE)
    shape = LoadShape(rate=1500, clients=200, duplicate_ratio=0.05, ledger=True, seed=5)
    kills = 0
    with supervised(path, bootstrap, tmp_path / "run", shape, [Phase(30, 1500)]) as run:
        controller, fleet = run.controller, run.fleet
        wait_for(run.worker_holds_slots(0), 60, "worker 0 to hold its slots")
        run.load.start()
        plan = ["up", "up", "down", "up", "down", "down"]
        for i, direction in enumerate(plan):
            result = controller.request_scale(direction, f"test {i}")  # type: ignore[arg-type]
            assert result.applied, result.detail
            if i in (1, 4):
                wait_for(lambda: bool(controller.publication.transit), 60, "the handoff to start")
                victim = min(controller.publication.awaiting)
                fleet.kill(victim, signal.SIGKILL)
                kills += 1
                assert controller.publication.transit, "the handoff completed before the kill"
            # One snapshot: reading the publication and `starting` apart can catch a rescale between them.
            wait_for(lambda: not (s := controller.status()).handoff_awaiting and not s.starting, 120,
                     f"rescale {i} to complete: {controller.status()}", interval=0.1)
            time.sleep(1.0)
        # Every rescale is done and the last one's slots flowed a second: the load ends here, and what
        # it sent is what the checks read.
        run.end_load()
        check_everything(bootstrap, topic_name, f"{topic_name}-g", run.totals.sent)
        restarts = sum(w.restarts for w in fleet.workers.values())
    assert kills == 2
    assert restarts >= 1  # a killed worker that was merged away is not restarted
    assert len(controller.rescales) == 6
    assert {r.action for r in controller.rescales} == {"split", "merge"}
    assert run.supervisor.history and run.supervisor.history[-1].processed > 0


def _worker_pids(spec_path: Path) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if b"worker" in args and str(spec_path).encode() in args:
            pids.append(int(cmdline.parent.name))
    return pids


def _processed_any(bootstrap: str, topic: str) -> bool:
    """Whether the run has committed a processed record yet; a read not at the end within its
    second is "not yet" (run F: a starved machine, the run's transactions open), not a failure."""
    if topic not in _topics(bootstrap):
        return False
    try:
        return len(read_processed(bootstrap, f"{topic}.processed", 1, timeout_seconds=1)) > 0
    except AssertionError:
        return False


@pytest.mark.slow
def test_keyrange_run_stops_cleanly_on_ctrl_c(bootstrap: str, topic_name: str, tmp_path: Path) -> None:
    path = tmp_path / "consumer.yaml"
    path.write_text(SPEC.format(name="ctrl-c", topic=topic_name, handler_config=QUEUED))
    proc = subprocess.Popen([sys.executable, "-m", "keyrange.cli", "run", "-f", str(path), "--bootstrap", bootstrap,
                             "--produce", "300", "--ledger", "--run-dir", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _processed_any(bootstrap, topic_name), 90, "the first processed record", interval=1.0)
        assert _worker_pids(path), "no worker process runs"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "stopping: workers finish in-flight events and commit" in stderr
    assert "handled" in stdout.splitlines()[-1]
    wait_for(lambda: not _worker_pids(path), 10, "the workers to exit", interval=0.2)


def _topics(bootstrap: str) -> set[str]:
    from keyrange.kafkaio import partition_counts

    return set(partition_counts(bootstrap))
