"""A broker outage: the worker waits it out (backoff, a few summarised log lines) instead of
exiting, and loses nothing, handles nothing twice, once the broker is back.

Each test runs its own single-node Apache Kafka, stopped and started again under the worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyrange.local.kafka_cluster import KafkaCluster
from keyrange.worker.transactions import CALL_STUCK_SECONDS, COMMIT_DEADLINE_SECONDS
from tests.checkers import check_all, first_occurrences
from tests.integration.worker_cli_helpers import PARTITIONS, metric_sum, start, wait, worker_command
from tests.integration.worker_helpers import produce_stream
from tests.kafkatools import read_counts, read_input_log, read_processed

OUTAGE_SECONDS = (15, 20)
"""20 s: the broker is back shortly before the slots' first flush gives up (the client timeout, 30 s
after the kill, as a restart takes ~5 s). There librdkafka 2.16 left some slot producers without a
usable connection after the broker was back ("No brokers available for Transactions"), their outputs
unacknowledged for minutes: without COMMIT_DEADLINE_SECONDS nothing was handled until the worker's
stop (finding A, 2026-11-25). That took chance: of 10 runs with an 18-20 s outage under load, one
never recovered (this test's failure then) and one took 49 s; COMMIT_DEADLINE_SECONDS has unit tests."""
RECOVERY_SECONDS = COMMIT_DEADLINE_SECONDS + CALL_STUCK_SECONDS + 15
"""From the broker's return to every event handled: a slot stuck since the kill gives its producer up
at the deadline, then is acquired again and catches up."""
QUIET_FROM_SECONDS = 5
"""CPU is measured from this far into the outage to its end. librdkafka 2.16's admin client spins
a core while a request waits for a broker it cannot reach, and the lag gauge asks the high
watermarks every second: the worker backs those requests off (1 s doubling; bug B, 2026-11-25).
Measured in this window: 3-4% of a core with the backoff, 91% without it."""
MAX_CPU_SHARE_WHILE_DOWN = 0.5


def librdkafka_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if "librdkafka" in line or line.startswith("%"))


@pytest.mark.slow
@pytest.mark.parametrize("outage_seconds", OUTAGE_SECONDS)
def test_a_worker_waits_out_a_broker_outage_and_loses_nothing(own_kafka: KafkaCluster, topic_name: str,
                                                              tmp_path: Path, outage_seconds: int) -> None:
    bootstrap = own_kafka.bootstrap
    first = produce_stream(bootstrap, topic_name, 2000, PARTITIONS, clients=80, duplicate_ratio=0.03, ledger=True)
    port, log_path = free_port_and_log(tmp_path)
    worker = start(worker_command(bootstrap, topic_name, port), log_path)
    try:
        wait(lambda: metric_sum(port, "keyrange_events_processed_total") >= 500, "the worker to run",
             proc=worker, log_path=log_path)
        node = own_kafka.node(1)
        node.terminate()  # mid-stream: events in flight, a transaction about to commit
        down_at = len(log_path.read_text())
        time.sleep(QUIET_FROM_SECONDS)
        cpu_before = cpu_seconds(worker.pid)
        time.sleep(outage_seconds - QUIET_FROM_SECONDS)
        cpu_share = (cpu_seconds(worker.pid) - cpu_before) / (outage_seconds - QUIET_FROM_SECONDS)
        print(f"worker CPU while Kafka was down (from {QUIET_FROM_SECONDS} s in): {cpu_share:.0%} of a core")
        assert worker.poll() is None, f"the worker exited during the outage:\n{log_path.read_text()[-3000:]}"
        during = log_path.read_text()[down_at:]
        own_kafka.restart(node)
        second = produce_stream(bootstrap, topic_name, 500, PARTITIONS, clients=80, duplicate_ratio=0.03,
                                ledger=True, seed=9)
        log = read_input_log(bootstrap, topic_name, first + second)
        distinct = len(first_occurrences(log))
        wait(lambda: read_counts(bootstrap, topic_name, f"{topic_name}-g", timeout_seconds=0).handled >= distinct,
             "every event handled after the broker came back", timeout_seconds=RECOVERY_SECONDS, proc=worker,
             log_path=log_path)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()  # never leave it behind (a commit retried forever ignored SIGTERM once)
            raise
        assert code == 0, log_path.read_text()[-3000:]
    # librdkafka's reconnect attempts are summarised: a handful of lines, not one per attempt.
    assert librdkafka_lines(during) <= 30, during[-3000:]
    # A worker waiting for its broker stays quiet (a busy machine can only make this share smaller).
    assert cpu_share < MAX_CPU_SHARE_WHILE_DOWN, f"the worker used {cpu_share:.0%} of a core while Kafka was down"
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", distinct),
              read_counts(bootstrap, topic_name, f"{topic_name}-g", covering=len(log)), ledger=True)


@pytest.mark.slow
def test_a_worker_started_before_its_broker_waits_for_it(own_kafka: KafkaCluster, topic_name: str,
                                                         tmp_path: Path) -> None:
    bootstrap = own_kafka.bootstrap
    sent = produce_stream(bootstrap, topic_name, 300, PARTITIONS, clients=40, duplicate_ratio=0.0, ledger=True)
    node = own_kafka.node(1)
    node.terminate()
    port, log_path = free_port_and_log(tmp_path)
    worker = start(worker_command(bootstrap, topic_name, port), log_path)
    try:
        wait(lambda: "trying again in" in log_path.read_text(), "a line saying the worker waits for Kafka",
             timeout_seconds=90, proc=worker, log_path=log_path)
        own_kafka.restart(node)
        wait(lambda: metric_sum(port, "keyrange_events_processed_total") >= sent, "every event handled",
             proc=worker, log_path=log_path)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, log_path.read_text()[-3000:]
    text = log_path.read_text()
    assert "cannot reach Kafka at" in text and "Traceback" not in text


def test_sigterm_while_waiting_for_the_broker_exits_cleanly(tmp_path: Path) -> None:
    from keyrange.local.ports import free_port

    port, log_path = free_port_and_log(tmp_path)
    worker = subprocess.Popen([sys.executable, "-m", "keyrange.cli", "worker", "--bootstrap",
                               f"127.0.0.1:{free_port()}", "--topic", "t", "--group", "g", "--partitions", "0",
                               "--metrics-port", str(port)],
                              stdout=log_path.open("ab"), stderr=subprocess.STDOUT)
    try:
        wait(lambda: "trying again in" in log_path.read_text(), "the worker to wait for Kafka", timeout_seconds=90,
             proc=worker, log_path=log_path)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log_path.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert "Traceback" not in log_path.read_text()


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, all its threads (user + system, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port_and_log(tmp_path: Path) -> tuple[int, Path]:
    from keyrange.local.ports import free_port

    return free_port(), tmp_path / "worker.log"
