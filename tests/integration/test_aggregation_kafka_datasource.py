"""The keyrange-kafka Spark data source against the embedded broker.

Offsets, ranges, read_committed, restarts from a checkpoint and the end-of-partition probe, with
several partitions and transactional (partly aborted) produce like the workers'.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from keyrange.aggregation.job import run_available_now
from keyrange.aggregation.kafka_datasource import KafkaStreamReader
from tests.integration.aggregation_helpers import (
    make_topic,
    processed_records,
    produce_processed,
    transactional_producer,
)


def _source(spark: Any, bootstrap: str, topic: str, streaming: bool = False, **options: str) -> Any:
    reader = spark.readStream if streaming else spark.read
    reader = reader.format("keyrange-kafka").option("bootstrap", bootstrap).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _stream_once(spark: Any, bootstrap: str, topic: str, checkpoint: Path) -> list[list[tuple[int, int]]]:
    """Run one availableNow query from `checkpoint`; the (partition, offset) rows of each batch."""
    batches: list[list[tuple[int, int]]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append([(r.partition, r.offset) for r in df.select("partition", "offset").collect()])

    run_available_now(lambda: _source(spark, bootstrap, topic, streaming=True).writeStream.foreachBatch(collect)
                      .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(),
                      timeout_seconds=300)
    return batches


def _committed_in_two_partitions(bootstrap: str, topic: str, records: int, value: bytes) -> Any:
    """Create `topic` with two partitions and write `records` copies of `value` over both in one
    committed transaction; return the transactional producer for more."""
    make_topic(bootstrap, topic, 2)
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    for i in range(records):
        producer.produce(topic, value=value, partition=i % 2)
    producer.commit_transaction(30)
    return producer


def test_batch_read_returns_every_committed_record_of_every_partition_once(spark, bootstrap, topic_name):
    make_topic(bootstrap, topic_name, 4)
    records = processed_records(1500, clients=40, seed=1)
    delivered = produce_processed(bootstrap, topic_name, records, 4, per_transaction=100, abort_every=3)

    df = _source(spark, bootstrap, topic_name)
    assert df.rdd.getNumPartitions() == 4  # one Spark partition per Kafka partition
    rows = df.collect()

    assert len(rows) == len(delivered)
    assert len({(r.partition, r.offset) for r in rows}) == len(rows)
    got = Counter((r.partition, r.key.decode(), orjson.loads(r.value)["uuid"]) for r in rows)
    want = Counter((d.partition, str(d.value["clientId"]), d.value["uuid"]) for d in delivered)
    assert got == want  # nothing from the aborted transactions, nothing lost
    assert all(r.topic == topic_name and r.timestamp is not None for r in rows)
    for p in range(4):
        offsets = [r.offset for r in rows if r.partition == p]
        assert offsets == sorted(offsets)


def test_batch_read_of_an_explicit_offset_range(spark, bootstrap, topic_name):
    make_topic(bootstrap, topic_name, 2)
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    for i in range(100):
        producer.produce(topic_name, value=str(i).encode(), partition=i % 2)
    producer.commit_transaction(30)

    rows = _source(spark, bootstrap, topic_name, startingOffsets=json.dumps({"0": 10, "1": 0}),
                   endingOffsets=json.dumps({"0": 20, "1": 5})).collect()
    assert sorted((r.partition, r.offset) for r in rows) == (
        [(0, o) for o in range(10, 20)] + [(1, o) for o in range(5)]
    )


def test_empty_topic_reads_nothing_in_batch_and_streaming(spark, bootstrap, topic_name, tmp_path):
    make_topic(bootstrap, topic_name, 3)
    assert _source(spark, bootstrap, topic_name).count() == 0
    assert sum(map(len, _stream_once(spark, bootstrap, topic_name, tmp_path / "ckpt"))) == 0


def test_missing_topic_is_a_clear_error(spark, bootstrap, topic_name):
    with pytest.raises(Exception, match="does not exist"):
        _source(spark, bootstrap, topic_name).count()


def test_restart_from_checkpoint_reads_only_new_records(spark, bootstrap, topic_name, tmp_path):
    make_topic(bootstrap, topic_name, 3)
    first = produce_processed(bootstrap, topic_name, processed_records(600, 30, seed=2), 3, abort_every=2)
    checkpoint = tmp_path / "ckpt"

    run1 = [row for batch in _stream_once(spark, bootstrap, topic_name, checkpoint) for row in batch]
    assert len(run1) == len(first)

    assert _stream_once(spark, bootstrap, topic_name, checkpoint) == []  # nothing new: no batch

    second = produce_processed(bootstrap, topic_name, processed_records(450, 30, seed=3), 3, abort_every=2)
    run3 = [row for batch in _stream_once(spark, bootstrap, topic_name, checkpoint) for row in batch]
    assert len(run3) == len(second)
    assert not set(run1) & set(run3)  # each record in exactly one run
    everything = {(r.partition, r.offset) for r in _source(spark, bootstrap, topic_name).collect()}
    assert set(run1) | set(run3) == everything


def test_end_probe_finds_the_true_end_after_batched_produce_and_skips_open_transactions(bootstrap, topic_name):
    """tansu's ListOffsets can answer too low right after a batched produce, and 0
    with an open transaction; the data source's end must be the committed end regardless."""
    producer = _committed_in_two_partitions(bootstrap, topic_name, 5000, b"x" * 50)
    reader = KafkaStreamReader({"bootstrap": bootstrap, "topic": topic_name})
    try:
        start = reader.initialOffset()
        assert start == {"0": 0, "1": 0}
        # 2500 records then one commit marker per partition.
        assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 2501, "1": 2501}

        producer.begin_transaction()
        for i in range(300):
            producer.produce(topic_name, value=b"open", partition=i % 2)
        producer.flush(30)
        # Records of an open transaction are not readable yet: the end does not move past them.
        assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 2501, "1": 2501}
        producer.commit_transaction(30)
        assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 2652, "1": 2652}

        # maxRecordsPerBatch caps the micro-batch, shared by the partitions.
        assert reader.latestOffset(start, ReadMaxRows(1000)) == {"0": 500, "1": 500}
    finally:
        reader.stop()


def test_available_now_stops_at_the_end_found_first_and_still_splits_batches(bootstrap, topic_name):
    producer = _committed_in_two_partitions(bootstrap, topic_name, 400, b"x")
    reader = KafkaStreamReader({"bootstrap": bootstrap, "topic": topic_name, "maxRecordsPerBatch": "300"})
    try:
        reader.prepareForTriggerAvailableNow()
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadMaxRows(300))
        assert first == {"0": 150, "1": 150}
        producer.begin_transaction()
        for i in range(100):  # arrives after the run began: left for the next run
            producer.produce(topic_name, value=b"late", partition=i % 2)
        producer.commit_transaction(30)
        second = reader.latestOffset(first, ReadMaxRows(300))
        assert second == {"0": 201, "1": 201}  # 200 records and the commit marker, no more
        assert reader.latestOffset(second, ReadMaxRows(300)) == second  # done
    finally:
        reader.stop()


def test_end_probe_reaches_the_end_even_when_every_fetch_brings_little_and_polls_come_back_empty(bootstrap, topic_name):
    """A loaded machine's slow fetches, made here by tiny fetch sizes and 1 ms polls: an empty poll
    must not pass for the end (it did, and `--once` then stopped early)."""
    from keyrange.aggregation.partition_reads import EndProbe, ReaderSettings

    _committed_in_two_partitions(bootstrap, topic_name, 4000, b"y" * 100)
    # Small fetches, each followed by a pause before the next one (the local queue is "full").
    slow = {"max.partition.fetch.bytes": "2048", "fetch.max.bytes": "4096", "message.max.bytes": "4096",
            "queued.min.messages": "1", "queued.max.messages.kbytes": "1", "fetch.queue.backoff.ms": "50"}
    settings = ReaderSettings(bootstrap, topic_name, probe_idle_ms=1, extra=slow)
    probe = EndProbe(settings)
    try:
        assert probe.ends({}) == {0: 2001, 1: 2001}
    finally:
        probe.close()
