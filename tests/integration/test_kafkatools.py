"""tests/kafkatools: read_topic, which every guarantee check reads its evidence through, and the
committed offsets and totals the worker tests watch, also while a broker is away."""

from __future__ import annotations

import time
import uuid
from concurrent import futures

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.local.kafka_cluster import KafkaCluster
from tests.checkers import Counts
from tests.integration.worker_cli_helpers import wait
from tests.kafkaretry import RETRY_SECONDS
from tests.kafkatools import offsets_committed_so_far, read_counts, read_topic

ONE_READ_TIMEOUT_SECONDS = 10
"""The longest a single read of read_counts waits before it gives up (the partition count's)."""


def _produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    for i in range(count):
        producer.produce(topic, str(i).encode(), partition=i % partitions)
    assert producer.flush(30) == 0


def test_expect_is_a_minimum_not_where_the_read_stops(bootstrap: str, topic_name: str) -> None:
    # More records than one consume call returns, so a reader that stopped at `expect` would stop
    # early; a record written past `expect` (an event handled twice) must be read too.
    ensure_topics(bootstrap, [TopicSpec(topic_name, 3)])
    _produce(bootstrap, topic_name, 3001, 3)
    records = read_topic(bootstrap, topic_name, expect=1000)
    assert len(records) == 3001
    assert sorted(int(m.value()) for m in records) == list(range(3001))


def test_a_topic_created_after_the_read_began_is_read(kafka_broker: KafkaCluster, topic_name: str) -> None:
    # A worker creates its processed topic when it starts, which on a busy machine (CI, a test over
    # TLS) came after the test began reading it: the read saw no partitions and returned nothing.
    bootstrap = kafka_broker.bootstrap  # Kafka: it never creates a topic because a client asked about it.
    with futures.ThreadPoolExecutor(1) as pool:
        read = pool.submit(read_topic, bootstrap, topic_name, expect=4, timeout_seconds=60)
        # Not a wait for anything: it puts the read's first metadata request before the topic exists.
        time.sleep(1)
        assert not read.done(), f"the read ended before its topic existed: {read.result()!r}"
        ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
        _produce(bootstrap, topic_name, 4, 2)
        assert sorted(int(m.value()) for m in read.result(timeout=90)) == [0, 1, 2, 3]


def test_a_topic_that_never_appears_fails_the_read_by_name(kafka_broker: KafkaCluster, topic_name: str) -> None:
    with pytest.raises(AssertionError, match=f"{topic_name}: the topic does not exist"):
        read_topic(kafka_broker.bootstrap, topic_name, expect=1, timeout_seconds=1)


def test_an_empty_topic_reads_as_empty(bootstrap: str, topic_name: str) -> None:
    ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
    assert read_topic(bootstrap, topic_name, timeout_seconds=30) == []


def test_a_log_shorter_than_expected_is_returned_whole_after_the_timeout(bootstrap: str, topic_name: str) -> None:
    # The caller's checks then say what is missing (e.g. which uuid was lost).
    ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
    _produce(bootstrap, topic_name, 10, 2)
    assert len(read_topic(bootstrap, topic_name, expect=11, timeout_seconds=2)) == 10


def test_a_partition_held_back_by_an_open_transaction_fails_the_read(bootstrap: str, topic_name: str) -> None:
    # read_committed cannot reach the end while a transaction is open: say so rather than return
    # part of the log as if it were all of it.
    ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
    _produce(bootstrap, topic_name, 10, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"test-{uuid.uuid4()}",
                         "log_level": 3})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic_name, b"open", partition=1)
    assert producer.flush(30) == 0
    try:
        with pytest.raises(AssertionError, match=r"not read to their end.*\{1: \(5, 6\)\}"):
            read_topic(bootstrap, topic_name, timeout_seconds=3)
        with pytest.raises(AssertionError, match=r"not read to their end"):
            read_topic(bootstrap, topic_name, expect=11, timeout_seconds=2)
        # While writers are at work, a caller that has what it waits for gets it after the timeout.
        assert len(read_topic(bootstrap, topic_name, expect=10, timeout_seconds=2)) == 10
    finally:
        producer.abort_transaction(30)
    # Decided, the transaction no longer holds the read back.
    values = {m.value() for m in read_topic(bootstrap, topic_name, expect=10, timeout_seconds=30)}
    assert {str(i).encode() for i in range(10)} <= values


def test_committed_offsets_read_while_a_transaction_holds_newer_ones_open(any_bootstrap: str, topic_name: str) -> None:
    bootstrap = any_bootstrap
    # A worker frozen (SIGSTOP) between sending its offsets to a transaction and committing it
    # leaves them pending until the transaction times out. A read_committed consumer's offset fetch
    # waits for them to settle (KIP-447's require_stable), so an observer reading the group's
    # offsets must get those committed so far instead of timing out.
    ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
    _produce(bootstrap, topic_name, 10, 2)
    group = f"{topic_name}-g"
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"test-{uuid.uuid4()}",
                         "log_level": 3})
    try:
        member.commit(offsets=[TopicPartition(topic_name, 0, 2), TopicPartition(topic_name, 1, 3)],
                      asynchronous=False)
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition(topic_name, 0, 5)],
                                             member.consumer_group_metadata(), 30)
        assert offsets_committed_so_far(bootstrap, topic_name, group, range(2)) == {0: 2, 1: 3}
        producer.commit_transaction(30)
        # Kafka writes the commit's markers to the offsets topic after it answers the commit.
        wait(lambda: offsets_committed_so_far(bootstrap, topic_name, group, range(2)) == {0: 5, 1: 3},
             "the transaction's offsets to read as committed", timeout_seconds=30)
    finally:
        member.close()


def test_the_committed_totals_are_read_once_a_frozen_broker_is_back(own_kafka: KafkaCluster, topic_name: str) -> None:
    # A broker away for longer than one read's timeout, as while it restarts: the read is tried
    # again until it answers, as a user's tool would.
    bootstrap, group = own_kafka.bootstrap, f"{topic_name}-g"
    ensure_topics(bootstrap, [TopicSpec(topic_name, 2), TopicSpec(f"{group}.state", 2)])
    node = own_kafka.node(1)
    node.pause()
    with futures.ThreadPoolExecutor(1) as pool:
        try:
            read = pool.submit(read_counts, bootstrap, topic_name, group, timeout_seconds=0)
            # The outage: longer than one read waits.
            done, _ = futures.wait([read], timeout=ONE_READ_TIMEOUT_SECONDS + 2)
            assert not done, f"the read gave up while the broker was away: {read.exception()!r}"
        finally:
            node.resume()
        assert read.result(timeout=RETRY_SECONDS) == Counts(0, 0, 0)
