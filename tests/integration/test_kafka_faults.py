"""Broker faults on a 3-node Apache Kafka cluster under load, checked with every guarantee checker.

Each test runs a StreamConsumer (`keyrange run`'s Supervisor, two worker subprocesses, a paced
ledger load with duplicates; tests/integration/fault_run.py) against `kafka_cluster3`, does one
fault while events flow, and ends with 0 lost, 0 handled twice, 0 reordered, every ledger result
equal to the sequential oracle and the committed totals exact. The leader's SIGKILL and the lost
broker run the ledger queued (a coroutine with 1 ms of simulated I/O), the rolling restart and the
frozen broker run it inline, as it ships (fault_run.QUEUED, INLINE). Each also shows that events were
handled while the fault lasted, prints the longest stall, and checks that no worker process
exited: a broker fault is the brokers' to heal, a worker rides it out.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from keyrange.local.kafka_cluster import KafkaCluster, KafkaNode
from keyrange.ranges.channel import control_topic
from tests.integration.fault_run import (
    INLINE,
    FaultRun,
    check_workers_rode_it_out,
    committed_between,
    describe_flow,
    now_ms,
    wait_until,
)
from tests.kafka_cluster_helpers import leader_of, partition_replicas

pytestmark = [
    pytest.mark.slow,
    # A hang's bound: each takes 1-2 min on 2 cores shared with other test runs (node restarts under load).
    pytest.mark.timeout(600),
]


def led_by(cluster: KafkaCluster, node: KafkaNode, topic: str) -> list[int]:
    """The partitions of `topic` that `node` leads, as the metadata says now."""
    return [p for p, state in partition_replicas(cluster, topic).items() if state.leader == node.node_id]


def test_sigkill_of_the_input_partitions_leader_mid_stream(kafka_cluster3: KafkaCluster, topic_name: str,
                                                           tmp_path: Path) -> None:
    run = FaultRun(kafka_cluster3.bootstrap, topic_name, tmp_path)
    try:
        run.start()
        run.wait_handled(1000, "before the kill")
        leader = leader_of(kafka_cluster3, topic_name, 0)
        killed_ms = now_ms()
        leader.kill()
        wait_until(lambda: not led_by(kafka_cluster3, leader, topic_name),
                   "the killed node's input partitions to get new leaders")
        led_ms = now_ms()
        run.wait_handled(1500, "with the leader dead")
        back_ms = now_ms()
        kafka_cluster3.restart(leader)
        run.wait_handled(1000, "after the node came back")
        done_ms = now_ms()
    except BaseException:
        run.stop()
        raise
    outcome = run.finish()
    describe_flow(f"node {leader.node_id} killed until restarted", run, outcome, killed_ms, back_ms)
    describe_flow("node restarting and back", run, outcome, back_ms, done_ms)
    # Flowing again with the node still dead, once its partitions had new leaders.
    assert committed_between(run, led_ms, back_ms) > 0
    check_workers_rode_it_out(outcome, run.log_dir)


SOAK = os.environ.get("KEYRANGE_SOAK") == "1"
"""`make soak` sets it: the slow variants run too (a rolling restart of all three nodes)."""


@pytest.mark.parametrize("restarted", [
    pytest.param(1, id="the-input-leader"),
    pytest.param(3, id="every-node", marks=pytest.mark.skipif(
        not SOAK, reason="three node restarts under load take minutes on 2 cores: `make soak` runs it")),
])
def test_rolling_restart_under_load(kafka_cluster3: KafkaCluster, topic_name: str, tmp_path: Path,
                                    restarted: int) -> None:
    run = FaultRun(kafka_cluster3.bootstrap, topic_name, tmp_path, handler_config=INLINE)
    windows = []
    try:
        run.start()
        run.wait_handled(1000, "before the first restart")
        # The input's leader first: its controlled shutdown hands leaderships over under load.
        first = leader_of(kafka_cluster3, topic_name, 0)
        for node in [first, *(n for n in kafka_cluster3.members if n is not first)][:restarted]:
            # SIGTERM: a controlled shutdown hands the node's leaderships over first, as a rolling
            # upgrade does; the next node goes only once this one serves and has handled events again.
            began_ms = now_ms()
            kafka_cluster3.restart(node)
            run.wait_handled(500, f"after node {node.node_id} came back")
            windows.append((node.node_id, began_ms, now_ms()))
    except BaseException:
        run.stop()
        raise
    outcome = run.finish()
    for node_id, began_ms, ended_ms in windows:
        describe_flow(f"node {node_id} restarting", run, outcome, began_ms, ended_ms)
    assert all(committed_between(run, began, ended) > 0 for _, began, ended in windows)
    check_workers_rode_it_out(outcome, run.log_dir)


def test_a_broker_frozen_past_its_session_timeout_then_resumed(kafka_cluster3: KafkaCluster, topic_name: str,
                                                               tmp_path: Path) -> None:
    run = FaultRun(kafka_cluster3.bootstrap, topic_name, tmp_path, handler_config=INLINE)
    try:
        run.start()
        run.wait_handled(1000, "before the freeze")
        frozen = leader_of(kafka_cluster3, topic_name, 0)
        frozen_ms = now_ms()
        frozen.pause()  # SIGSTOP: its sockets stay open, but nothing answers
        # broker.session.timeout.ms: the quorum fences it and its partitions get new leaders.
        wait_until(lambda: not led_by(kafka_cluster3, frozen, topic_name),
                   "the frozen node's input partitions to get new leaders")
        # replica.lag.time.max.ms: the leaders drop it from every in-sync replica set.
        wait_until(lambda: all(frozen.node_id not in s.in_sync
                               for s in partition_replicas(kafka_cluster3, topic_name).values()),
                   "the frozen node to leave the in-sync replicas")
        shrunk_ms = now_ms()
        run.wait_handled(1000, "while the node is frozen")
        resumed_ms = now_ms()
        frozen.resume()
        wait_until(lambda: all(frozen.node_id in s.in_sync
                               for s in partition_replicas(kafka_cluster3, topic_name).values()),
                   "the resumed node to catch up and rejoin the in-sync replicas")
        run.wait_handled(1000, "after it resumed")
        done_ms = now_ms()
    except BaseException:
        run.stop()
        raise
    outcome = run.finish()
    describe_flow(f"node {frozen.node_id} frozen", run, outcome, frozen_ms, resumed_ms)
    describe_flow("node resumed and back in sync", run, outcome, resumed_ms, done_ms)
    # Flowing with the node still frozen and out of every in-sync replica set.
    assert committed_between(run, shrunk_ms, resumed_ms) > 0
    check_workers_rode_it_out(outcome, run.log_dir)


def test_keyranges_own_topics_survive_losing_a_broker(kafka_cluster3: KafkaCluster, topic_name: str,
                                                      tmp_path: Path) -> None:
    run = FaultRun(kafka_cluster3.bootstrap, topic_name, tmp_path)
    own = [control_topic(run.group), f"{run.group}.state", f"{topic_name}.processed", f"{topic_name}.dlq"]
    try:
        run.start()
        # keyrange created these with the broker's defaults: 3 replicas, writes need 2 in sync.
        replicas = {t: {len(s.replicas) for s in partition_replicas(kafka_cluster3, t).values()} for t in own}
        assert replicas == {t: {3} for t in own}
        admin = AdminClient({"bootstrap.servers": kafka_cluster3.bootstrap, "log_level": 0})
        configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in own])
        assert {r.name: f.result()["min.insync.replicas"].value for r, f in configs.items()} == dict.fromkeys(own, "2")
        run.wait_handled(1000, "before the broker is lost")
        # The node leading the control topic: the controller's and the workers' coordination.
        lost = leader_of(kafka_cluster3, own[0], 0)
        lost_ms = now_ms()
        lost.kill()
        wait_until(lambda: all(s.leader not in (-1, lost.node_id) and len(s.in_sync) == 2
                               for t in own for s in partition_replicas(kafka_cluster3, t).values()),
                   "every partition of keyrange's topics to be led with 2 replicas in sync")
        run.poison(5)  # written to the dead-letter topic while the broker is lost
        run.wait_handled(1000, "with a broker lost")
        # A worker crash now: its successor restores state and outputs from the two replicas left.
        assert run.supervisor.fleet is not None
        run.supervisor.fleet.kill(0, signal.SIGKILL)
        wait_until(lambda: run.supervisor.fleet is not None and run.supervisor.fleet.workers[0].restarts >= 1,
                   "the killed worker to be restarted")
        worker_back_ms = now_ms()
        run.wait_handled(1500, "after the worker restarted, with the broker still lost")
        done_ms = now_ms()
    except BaseException:
        run.stop()
        raise
    outcome = run.finish()  # the lost broker is still down: two replicas of three serve everything
    describe_flow(f"node {lost.node_id} lost", run, outcome, lost_ms, done_ms)
    assert not lost.is_running()
    assert outcome.dead_letter_reasons == ["not-json"] * 5
    assert committed_between(run, worker_back_ms, done_ms) > 0
    assert outcome.restarts >= 1
    check_workers_rode_it_out(outcome, run.log_dir, deliberate=1)
