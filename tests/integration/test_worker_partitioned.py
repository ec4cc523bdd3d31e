"""A worker cut off from Kafka by a network that drops packets silently (no reset: its requests
just go unanswered), and replaced meanwhile, as Kubernetes does with a pod on a node that stopped
answering: the replacement takes worker 0 over and fences the old one's transactional ids at the
broker; once the network heals, the old one commits nothing (its transactions were aborted) and
stands down on reading the newer claim. Nothing is lost, nothing handled twice, and exactly one
owner commits each event.

Apache Kafka only: the partitioned worker reaches the broker through a listener whose advertised
address is the test's relay, so only its traffic crosses the fault; tansu has a single advertised
listener, so every client would."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import keyrange.local.kafka_cluster as kafka_module
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape
from keyrange.local.kafka_cluster import QUICK_START_JVM_OPTIONS, KafkaCluster
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.ranges.channel import ControlChannel
from keyrange.ranges.controller import Controller
from keyrange.ranges.planner import ScalingLimits, SlotLag
from tests.integration.supervised import check_everything, consumer_yaml, wait_for
from tests.kafkatools import committed_input_records
from tests.netfaults import BlackholeRelay

RELAYED = "RELAYED"
PARTITIONS = 4


@pytest.fixture(scope="module")
def relayed_kafka() -> Iterator[tuple[KafkaCluster, BlackholeRelay]]:
    """A Kafka node whose RELAYED listener is advertised at a relay's address (the test stands in for
    the network there, rewriting that one advertised address; everything else is the real broker)."""
    relay = BlackholeRelay()
    original = kafka_module.server_properties

    def advertise_the_relay(node: Any, *args: Any, **kwargs: Any) -> dict[str, str]:
        props = original(node, *args, **kwargs)
        props["advertised.listeners"] = props["advertised.listeners"].replace(
            f"{RELAYED}://127.0.0.1:{node.extra_ports[RELAYED]}", f"{RELAYED}://127.0.0.1:{relay.port}")
        return props

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kafka_module, "server_properties", advertise_the_relay)
        cluster = KafkaCluster(nodes=1, jvm_options=QUICK_START_JVM_OPTIONS, extra_listeners={RELAYED: "PLAINTEXT"})
        cluster.start()
    try:
        relay.connect_to(cluster.members[0].address.extra_ports[RELAYED])
        yield cluster, relay
    finally:
        cluster.stop()
        relay.close()


class _NoLag:
    def slot_lag(self) -> Mapping[int, SlotLag]:
        return {}


def _worker(spec: Path, bootstrap: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "keyrange.cli", "worker", "--spec-file", str(spec),
                                 "--bootstrap", bootstrap, "--worker-id", "0"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_worker_partitioned_silently_and_replaced_commits_nothing_and_stands_down(
        relayed_kafka: tuple[KafkaCluster, BlackholeRelay], topic_name: str, tmp_path: Path) -> None:
    cluster, relay = relayed_kafka
    direct, through_relay = cluster.bootstrap, f"127.0.0.1:{relay.port}"
    group = f"{topic_name}-g"
    spec = tmp_path / "consumer.yaml"
    spec.write_text(consumer_yaml("partitioned", topic_name, PARTITIONS))
    ensure_topics(direct, [TopicSpec(topic_name, PARTITIONS)])
    ControlChannel.ensure_topic(direct, group)
    controller = Controller(ControlChannel(direct, group, "test-controller"), PARTITIONS,
                            ScalingLimits(min_workers=1, max_workers=1), _NoLag())
    controller.start()
    state = controller.channel.state
    stop, load_stop, totals = threading.Event(), threading.Event(), LoadTotals()
    steps = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    steps.start()
    shape = LoadShape(rate=300, clients=60, duplicate_ratio=0.05, ledger=True, seed=11)
    load = threading.Thread(target=produce_phases,
                            args=(direct, topic_name, shape, [Phase(30, 300)], load_stop, totals), daemon=True)
    old = _worker(spec, through_relay, tmp_path / "old.log")
    new = None
    try:
        wait_for(lambda: 0 in state.reports and len(state.reports[0].held) == PARTITIONS, 90,
                  "the old worker to hold every slot")
        load.start()
        wait_for(lambda: committed_input_records(direct, topic_name, group) > 0, 90,
                 "the old worker to handle and commit through the relay", interval=0.2)
        relay.blackhole()
        sent_at_cut = totals.sent
        new = _worker(spec, direct, tmp_path / "new.log")
        wait_for(lambda: 0 in state.claims and state.claims[0].pid == new.pid
                  and state.reports[0].pid == new.pid and len(state.reports[0].held) == PARTITIONS, 90,
                  "the replacement to claim worker 0 and hold every slot")
        wait_for(lambda: committed_input_records(direct, topic_name, group) > sent_at_cut, 90,
                 "the replacement to handle what the old one had in flight, and more", interval=0.2)
        relay.heal()
        code = old.wait(timeout=180)
        # The old worker stood down: every step is done. The load ends here, and what it sent is
        # what the checks read.
        load_stop.set()
        load.join(timeout=120)
        assert not load.is_alive()
        check_everything(direct, topic_name, group, totals.sent)
    finally:
        stop.set()
        load_stop.set()
        relay.heal()
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
        steps.join(timeout=10)
        controller.channel.close()
    old_output = (tmp_path / "old.log").read_text(errors="replace")
    assert code == 2 and "claimed by another process" in old_output, old_output[-3000:]
