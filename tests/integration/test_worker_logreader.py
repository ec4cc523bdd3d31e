"""A restore's reads time out when they stop moving, not after a fixed time: a large changelog or
backlog is read to its end however long that takes, and a read held back (an open transaction, a
topic that does not exist) fails with a RestoreError that says why."""

from __future__ import annotations

import threading
import time

import pytest
from benchmarks.batch_write_rate import FAST, append_one_record_batches, one_record_batch_producer
from confluent_kafka import Producer

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker.logreader import LogReader, RestoreError
from keyrange.worker.totals import committed_totals
from tests.integration.worker_helpers import settings_for
from tests.kafkatools import flush_while_delivering

BATCHES = 100
"""One record each: with one batch per fetch, the read takes this many fetches."""
HELD_FETCH_MS = 20
"""How long the broker holds each fetch (see below): BATCHES of them outlast the read's timeout
4 times over, however fast the machine, while each gap between records stays 25 times shorter."""
READ_TIMEOUT_SECONDS = 0.5
LONG_LOG_BATCHES = 30_000
"""One record each: tansu lists every batch of a partition to answer a fetch (docs/kafka.md), which
on a busy 2-core machine took longer than a restore's 5 ms fetch wait from 20,000 batches on."""
TAIL = 200
"""Records read from inside the long log, as a restore reads those before a committed offset."""
TAIL_READ_BOUND_SECONDS = 10.0
"""Generous for a busy machine: a read of TAIL records takes milliseconds once the broker answers."""


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


def _append_one_record_batches(bootstrap: str, topic: str, count: int, stop: threading.Event | None = None) -> None:
    # Not idempotent (FAST): the long log is written 1.5-2x as fast (BENCHMARKS.md); only the
    # batches' count and offsets matter here.
    producer = one_record_batch_producer(bootstrap, FAST)
    append_one_record_batches(producer, topic, count, stop)
    assert flush_while_delivering(producer) == 0


def test_a_read_from_inside_a_long_log_being_written_reaches_its_end(any_bootstrap: str, topic_name: str) -> None:
    """The demo's merges waited out the read-ahead timeout on tansu: its reads of a partition
    tens of thousands of batches long got empty fetch answers for seconds at a time."""
    ensure_topics(any_bootstrap, [TopicSpec(topic_name, 1)])
    _append_one_record_batches(any_bootstrap, topic_name, LONG_LOG_BATCHES)
    stop = threading.Event()
    writer = threading.Thread(target=_append_one_record_batches,
                              args=(any_bootstrap, topic_name, LONG_LOG_BATCHES, stop))
    writer.start()
    reader = LogReader(settings_for(any_bootstrap, topic_name))
    try:
        reader.connect([topic_name])
        span = (topic_name, 0)
        stop_at = LONG_LOG_BATCHES
        began = time.monotonic()
        logs, ends = reader.read({span: stop_at - TAIL}, {span: stop_at})
        took = time.monotonic() - began
    finally:
        reader.close()
        stop.set()
        writer.join()
    assert [m.offset() for m in logs[span]] == list(range(stop_at - TAIL, stop_at))
    assert ends[span] == stop_at
    assert took < TAIL_READ_BOUND_SECONDS, f"reading {TAIL} records from inside the log took {took:.1f} s"
