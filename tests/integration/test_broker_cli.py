"""`keyrange broker`: both engines start, print their bootstrap address once they serve, and stop
cleanly on SIGTERM and on Ctrl-C (no process left behind, no temporary folder left behind)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, PartitionMetadata

from keyrange.local.kafka_cluster import answers_api_versions
from keyrange.toolsdir import tools_dir

KAFKA_LIBS = tools_dir() / "kafka" / "libs"


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return found


class BrokerCommand:
    """`keyrange broker ...` as a subprocess in its own session (so Ctrl-C can go to its group)."""

    def __init__(self, args: list[str], tmp_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        full_env = {**os.environ, "TMPDIR": str(self.tmp), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "keyrange.cli", "broker", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                                     start_new_session=True)

    def bootstrap(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line, f"no bootstrap address printed; stderr: {self.stderr()}"
        return line

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def stop_with(self, how: str) -> int:
        """SIGTERM to the process, or Ctrl-C: SIGINT to its whole process group, as a terminal does."""
        if how == "sigterm":
            self.proc.terminate()
        else:
            os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


StartBroker = Callable[..., BrokerCommand]


@pytest.fixture
def broker_command(tmp_path: Path) -> Iterator[StartBroker]:
    """Starts `keyrange broker ARGS` (env: extra variables); kills what is left after the test."""
    started: list[BrokerCommand] = []

    def start(args: list[str], env: Mapping[str, str] | None = None) -> BrokerCommand:
        started.append(BrokerCommand(args, tmp_path, env))
        return started[-1]

    yield start
    for command in started:
        command.close()


def _assert_stops_cleanly(command: BrokerCommand, how: str, bootstrap: str) -> None:
    children = _children(command.proc.pid)
    assert children, "the broker should run as a child process"
    assert command.stop_with(how) == 0, command.stderr()
    for pid in children:
        assert not Path(f"/proc/{pid}").exists(), f"broker child {pid} outlived `keyrange broker`"
    for address in bootstrap.split(","):
        assert not answers_api_versions(int(address.rsplit(":", 1)[1]))
    assert list(command.tmp.iterdir()) == [], "temporary folders were left behind"


def _led_partitions(admin: AdminClient, topic: str, count: int) -> dict[int, PartitionMetadata]:
    """The topic's partitions once the metadata shows all `count` of them with a leader."""
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        partitions = {} if meta is None or meta.error is not None else meta.partitions
        if len(partitions) == count and all(p.leader >= 0 for p in partitions.values()):
            return partitions
        assert time.monotonic() < deadline, f"{topic} has no leader for every partition: {partitions}"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_tansu_broker_serves_then_stops_cleanly(broker_command: StartBroker, how: str) -> None:
    command = broker_command(["--port", "0"])
    bootstrap = command.bootstrap()
    assert bootstrap.startswith("127.0.0.1:")
    assert answers_api_versions(int(bootstrap.rsplit(":", 1)[1]))
    _assert_stops_cleanly(command, how, bootstrap)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_kafka_broker_serves_then_stops_cleanly(broker_command: StartBroker, tmp_path: Path,
                                                how: str) -> None:
    # The Ctrl-C run finds the jars through $KAFKA_HOME alone; the SIGTERM run in the tools folder.
    env = {"KAFKA_HOME": ""}
    if how == "ctrl-c":
        (tmp_path / "kafka-home").mkdir()
        (tmp_path / "kafka-home" / "libs").symlink_to(KAFKA_LIBS)
        env = {"KAFKA_HOME": str(tmp_path / "kafka-home"), "KEYRANGE_TOOLS": str(tmp_path / "no-tools")}
    command = broker_command(["--engine", "kafka", "--port", "0"], env)
    bootstrap = command.bootstrap()
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert len(metadata.brokers) == 1
    _assert_stops_cleanly(command, how, bootstrap)


def test_kafka_broker_without_jars_says_how_to_get_them(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_HOME"}
    env["KEYRANGE_TOOLS"] = str(tmp_path / "no-tools")
    result = subprocess.run([sys.executable, "-m", "keyrange.cli", "broker", "--engine", "kafka", "--port", "0"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("keyrange broker: error: Apache Kafka's jars are not in ")
    assert "make tools" in lines[0] and "KAFKA_HOME" in lines[0]


def test_tansu_has_no_nodes_option() -> None:
    result = subprocess.run([sys.executable, "-m", "keyrange.cli", "broker", "--nodes", "3"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "keyrange broker: error: tansu runs a single node: --nodes needs --engine kafka"


def _described(admin: AdminClient, resource: ConfigResource) -> dict[str, Any]:
    """The resource's configs, once the node asked knows the new topic (a node of the quorum can
    answer UNKNOWN_TOPIC_OR_PART for a moment after the topic was created)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return dict(admin.describe_configs([resource])[resource].result(timeout=10))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow
def test_a_three_node_quorum_elects_leaders_and_replicates_to_all(broker_command: StartBroker) -> None:
    command = broker_command(["--engine", "kafka", "--port", "0", "--nodes", "3"])
    bootstrap = command.bootstrap()
    assert len(bootstrap.split(",")) == 3
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]

    # No replication factor given: the cluster's default (every node) applies.
    admin.create_topics([NewTopic("replicated", 3)])["replicated"].result(timeout=30)
    partitions = _led_partitions(admin, "replicated", 3)
    assert {p.leader for p in partitions.values()} == {1, 2, 3}, "each node should lead one partition"
    for p in partitions.values():
        assert sorted(p.replicas) == [1, 2, 3]
    resource = ConfigResource(ConfigResource.Type.TOPIC, "replicated")
    configs = _described(admin, resource)
    assert configs["min.insync.replicas"].value == "2"

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(300):
        producer.produce("replicated", key=str(i % 7), value=str(i), partition=i % 3)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "replicated-reader", "log_level": 3})
    consumer.assign([TopicPartition("replicated", p, 0) for p in range(3)])
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + 60
    while sum(len(v) for v in seen.values()) < 300 and time.monotonic() < deadline:
        for message in consumer.consume(500, timeout=0.5):
            assert message.error() is None, message.error()
            seen[message.partition()].append(int(message.value()))
    consumer.close()
    del producer, consumer
    assert seen == {p: list(range(p, 300, 3)) for p in range(3)}
    partitions = admin.list_topics("replicated", timeout=10).topics["replicated"].partitions
    assert all(sorted(p.isrs) == [1, 2, 3] for p in partitions.values())
    del admin
    _assert_stops_cleanly(command, "sigterm", bootstrap)


@pytest.mark.parametrize("engine", ["tansu", "kafka"])
def test_a_port_something_listens_on_is_refused_in_one_line_before_a_broker_starts(engine: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        command = [sys.executable, "-m", "keyrange.cli", "broker", "--engine", engine, "--port", str(port)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"keyrange broker: error: port {port} on 127.0.0.1 is in use (another broker?): "
                                      "stop what listens there, or pick another with --port (0 for any free one)")
