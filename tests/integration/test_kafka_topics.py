"""Topics keyrange creates: served as soon as they are created, the broker's default replication
factor unless the spec gives one, never 1 silently; an existing state or control topic that is not
compacted is an error."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from keyrange.kafkaio import KafkaSetupError, TopicSpec, ensure_topics
from keyrange.local.kafka_cluster import KafkaCluster
from keyrange.ranges.channel import ControlChannel, control_topic


def _replicas(bootstrap: str, topic: str) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted({len(p.replicas) for p in meta.partitions.values()})
        assert time.monotonic() < deadline, f"{topic} never showed up in the metadata"
        time.sleep(0.1)


def test_topics_take_the_brokers_replication_factor_or_the_spec_s(kafka_cluster3: KafkaCluster,
                                                                   topic_name: str) -> None:
    bootstrap = kafka_cluster3.bootstrap
    ensure_topics(bootstrap, [TopicSpec(f"{topic_name}.default", 3)])
    assert _replicas(bootstrap, f"{topic_name}.default") == [3]
    ensure_topics(bootstrap, [TopicSpec(f"{topic_name}.two", 3)], replication_factor=2)
    assert _replicas(bootstrap, f"{topic_name}.two") == [2]
    ControlChannel.ensure_topic(bootstrap, topic_name)
    assert _replicas(bootstrap, control_topic(topic_name)) == [3]


def test_an_existing_topic_that_must_be_compacted_but_is_not_is_an_error(any_bootstrap: str,
                                                                          topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": any_bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, -1, config={"cleanup.policy": "delete"})])[topic_name].result(30)
    _replicas(any_bootstrap, topic_name)
    with pytest.raises(KafkaSetupError) as info:
        ensure_topics(any_bootstrap, [TopicSpec(topic_name, 1, {"cleanup.policy": "compact"})])
    assert f"topic {topic_name!r} exists with cleanup.policy=delete" in str(info.value)
    assert "needs cleanup.policy=compact" in str(info.value)
    # A compacted one passes.
    admin.create_topics([NewTopic(f"{topic_name}.ok", 1, -1, config={"cleanup.policy": "compact"})])[
        f"{topic_name}.ok"].result(30)
    _replicas(any_bootstrap, f"{topic_name}.ok")
    assert ensure_topics(any_bootstrap, [TopicSpec(f"{topic_name}.ok", 1, {"cleanup.policy": "compact"})]) == {
        f"{topic_name}.ok": 1}


def test_created_topics_answer_offset_lookups_at_once(any_bootstrap: str, topic_name: str) -> None:
    """A worker's restore looks offsets up by time right after creating its topics: on Kafka the
    new leaders answered NOT_LEADER_FOR_PARTITION for a moment, which librdkafka does not retry."""
    consumer = Consumer({"bootstrap.servers": any_bootstrap, "group.id": topic_name, "log_level": 0})
    try:
        for i in range(5):
            names = [f"{topic_name}-{i}", f"{topic_name}-{i}.state"]
            ensure_topics(any_bootstrap, [TopicSpec(names[0], 6),
                                          TopicSpec(names[1], 6, {"cleanup.policy": "compact"})])
            since_ms = int(time.time() * 1000) - 10_000
            found = consumer.offsets_for_times([TopicPartition(n, p, since_ms) for n in names for p in range(6)],
                                               timeout=10)
            assert all(tp.error is None for tp in found), found
    finally:
        consumer.close()
