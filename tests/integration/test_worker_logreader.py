"""A restore's reads time out when they stop moving, not after a fixed time: a large changelog or
backlog is read to its end however long that takes, and a read held back (an open transaction, a
topic that does not exist) fails with a RestoreError that says why."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker.logreader import LogReader, RestoreError
from keyrange.worker.totals import committed_totals
from tests.integration.worker_helpers import settings_for

BATCHES = 100
"""One record each: with one batch per fetch, the read takes this many fetches."""
HELD_FETCH_MS = 20
"""How long the broker holds each fetch (see below): BATCHES of them outlast the read's timeout
4 times over, however fast the machine, while each gap between records stays 25 times shorter."""
READ_TIMEOUT_SECONDS = 0.5


def test_a_read_longer_than_the_timeout_succeeds_while_it_makes_progress(kafka_bootstrap: str, topic_name: str) -> None:
    bootstrap = kafka_bootstrap
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log_level": 3})
    for i in range(BATCHES):
        producer.produce(topic_name, b"v" * 100, str(i).encode(), partition=0)
        assert producer.flush(30) == 0  # each record its own batch
    # The read's length is set by the broker, not by the machine's speed (a read sized in records
    # came back in 0.49 s in CI against a 0.5 s timeout): Apache Kafka answers a fetch with one
    # batch when the partition's fetch size is 1 byte, and holds it for fetch.wait.max.ms because
    # that batch is short of fetch.min.bytes. tansu ignores both, so this runs on Kafka only.
    held_fetches = {"max.partition.fetch.bytes": "1", "fetch.min.bytes": "1000000",
                    "fetch.wait.max.ms": str(HELD_FETCH_MS)}
    reader = LogReader(settings_for(bootstrap, topic_name, kafka_timeout_seconds=READ_TIMEOUT_SECONDS,
                                    client_properties=held_fetches))
    try:
        began = time.monotonic()
        logs, ends = reader.read({(topic_name, 0): 0})
        took = time.monotonic() - began
    finally:
        reader.close()
    assert [m.key() for m in logs[(topic_name, 0)]] == [str(i).encode() for i in range(BATCHES)]
    assert ends[(topic_name, 0)] == BATCHES
    assert took > BATCHES * HELD_FETCH_MS / 1000 > READ_TIMEOUT_SECONDS, (
        f"the read took {took:.2f} s: the broker did not hold each fetch, so the test shows nothing")


def test_a_read_held_back_by_an_open_transaction_fails_saying_so(any_bootstrap: str, topic_name: str) -> None:
    ensure_topics(any_bootstrap, [TopicSpec(topic_name, 1)])
    producer = Producer({"bootstrap.servers": any_bootstrap, "transactional.id": f"{topic_name}-open",
                         "log_level": 3})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic_name, b"never committed", partition=0)
    assert producer.flush(30) == 0
    reader = LogReader(settings_for(any_bootstrap, topic_name, kafka_timeout_seconds=1.0))
    try:
        with pytest.raises(RestoreError, match=r"made no progress for 1 s \(an open transaction holds it back"):
            reader.read({(topic_name, 0): 0})
    finally:
        reader.close()
        producer.abort_transaction(30)


def test_a_read_of_a_topic_that_does_not_exist_fails_saying_so(any_bootstrap: str, topic_name: str) -> None:
    ensure_topics(any_bootstrap, [TopicSpec(topic_name, 1)])
    reader = LogReader(settings_for(any_bootstrap, topic_name, kafka_timeout_seconds=1.0))
    try:
        missing = f"{topic_name}.missing"
        with pytest.raises(RestoreError, match=f"made no progress for 1 s: the broker has no topic {missing}$"):
            reader.read({(topic_name, 0): 0, (missing, 0): 0})
    finally:
        reader.close()


def test_the_totals_of_a_group_without_a_changelog_fail_saying_the_topic_is_missing(any_bootstrap: str,
                                                                                     topic_name: str) -> None:
    """Finding where the changelog's snapshot starts looks up its bounds first: a missing topic is
    named there too, not a librdkafka "Unknown partition"."""
    ensure_topics(any_bootstrap, [TopicSpec(topic_name, 1)])
    settings = settings_for(any_bootstrap, topic_name, kafka_timeout_seconds=1.0)
    with pytest.raises(RestoreError, match=f"the broker has no topic {settings.state}$"):
        committed_totals(settings, [0])
