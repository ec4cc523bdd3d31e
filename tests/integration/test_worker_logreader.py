"""A restore's reads time out when they stop moving, not after a fixed time: a large changelog or
backlog is read to its end however long that takes, and a read held back (an open transaction)
fails with a RestoreError that says why."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker.logreader import LogReader, RestoreError
from tests.integration.worker_helpers import settings_for

RECORDS = 120_000


def test_a_read_longer_than_the_timeout_succeeds_while_it_makes_progress(kafka_bootstrap: str, topic_name: str) -> None:
    bootstrap = kafka_bootstrap
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 4096, "log_level": 3})
    for i in range(RECORDS):
        while True:
            try:
                producer.produce(topic_name, b"v" * 100, str(i).encode(), partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    # Small batches and small fetches (on Apache Kafka, which honours the fetch size; tansu answers
    # with the whole log): the read advances in many short steps and, in all, outlasts its timeout
    # even on a quiet machine, where the whole 12 MB log in large batches came back in 0.3 s.
    small_fetches = {"max.partition.fetch.bytes": "4096"}
    reader = LogReader(settings_for(bootstrap, topic_name, kafka_timeout_seconds=0.5, client_properties=small_fetches))
    try:
        began = time.monotonic()
        logs, ends = reader.read({(topic_name, 0): 0})
        took = time.monotonic() - began
    finally:
        reader.close()
    assert len(logs[(topic_name, 0)]) == RECORDS and ends[(topic_name, 0)] == RECORDS
    assert took > 0.5, f"the read took {took:.2f} s: too short to show a read outlasting its timeout"


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
        with pytest.raises(RestoreError, match="made no progress for 1 s"):
            reader.read({(topic_name, 0): 0})
    finally:
        reader.close()
        producer.abort_transaction(30)
