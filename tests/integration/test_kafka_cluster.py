"""The 3-node Apache Kafka fixture's fault handles do what fault tests rely on: a killed partition
leader is replaced and loses no acknowledged record, a restarted node rejoins the ISR, a paused
node stops answering and serves again once resumed."""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from keyrange.local.kafka_cluster import KafkaCluster
from tests.kafka_cluster_helpers import leader_of


def _wait_for(condition: Callable[[], bool], what: str, timeout_seconds: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _isr(admin: AdminClient, topic: str) -> list[int]:
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    return sorted(meta.partitions[0].isrs) if 0 in meta.partitions else []


def _produce(producer: Producer, topic: str, values: range) -> None:
    for i in values:
        producer.produce(topic, value=str(i), partition=0)
    assert producer.flush(60) == 0, "records left unacknowledged"


def test_a_killed_leader_is_replaced_without_losing_acknowledged_records(kafka_cluster3: KafkaCluster,
                                                                        topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster3.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1)])[topic_name].result(timeout=30)
    _wait_for(lambda: _isr(admin, topic_name) == [1, 2, 3], "three in-sync replicas")
    producer = Producer({"bootstrap.servers": kafka_cluster3.bootstrap, "acks": "all",
                         "enable.idempotence": True, "log_level": 0})
    _produce(producer, topic_name, range(0, 200))

    leader = leader_of(kafka_cluster3, topic_name, 0)
    leader.kill()
    _wait_for(lambda: leader_of(kafka_cluster3, topic_name, 0) is not leader, "a new leader")
    _produce(producer, topic_name, range(200, 400))

    consumer = Consumer({"bootstrap.servers": kafka_cluster3.bootstrap, "group.id": topic_name, "log_level": 0})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    values: list[int] = []
    deadline = time.monotonic() + 60
    while len(values) < 400 and time.monotonic() < deadline:
        values += [int(m.value()) for m in consumer.consume(500, 0.5) if m.error() is None]
    consumer.close()
    assert values == list(range(400)), "every acknowledged record once, in order"

    kafka_cluster3.restart(leader)
    _wait_for(lambda: _isr(admin, topic_name) == [1, 2, 3], "the restarted node back in the ISR")


def test_a_paused_node_stops_answering_and_serves_again_once_resumed(kafka_cluster3: KafkaCluster) -> None:
    node = kafka_cluster3.node(2)
    node.pause()
    assert node.is_running() and not node.is_serving()
    node.resume()
    kafka_cluster3.wait_until_ready(60, [node])
    assert node.is_serving()
