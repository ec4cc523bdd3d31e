"""Pure parts of the keyrange-kafka data source: options, offsets, planning and batch caps."""

from __future__ import annotations

import pickle

import pytest

from keyrange.aggregation.kafka_datasource import (
    KafkaStreamReader,
    OffsetRange,
    cap_ends,
    from_spark_offset,
    parse_offsets,
    plan_ranges,
    settings_from_options,
    to_spark_offset,
)
from keyrange.aggregation.partition_reads import KafkaReadError


def test_offsets_round_trip_through_spark_json_shape():
    offsets = {2: 7, 0: 10, 11: 0}
    spark_offset = to_spark_offset(offsets)
    assert spark_offset == {"0": 10, "2": 7, "11": 0}
    assert from_spark_offset(spark_offset) == offsets


@pytest.mark.parametrize("text", ["earliest", "latest"])
def test_named_starting_offsets_are_resolved_later(text):
    assert parse_offsets(text, "startingOffsets") is None


def test_json_offsets_parse_and_bad_ones_name_the_option():
    assert parse_offsets('{"0": 42, "3": 1}', "startingOffsets") == {0: 42, 3: 1}
    with pytest.raises(KafkaReadError, match="endingOffsets must be"):
        parse_offsets("yesterday", "endingOffsets")
    with pytest.raises(KafkaReadError, match="startingOffsets"):
        parse_offsets('{"zero": 1}', "startingOffsets")


def test_plan_has_one_range_per_partition_with_records():
    ranges = plan_ranges({0: 5, 1: 9, 2: 0}, {0: 8, 1: 9, 2: 4, 3: 2})
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 5, 8), (2, 0, 4), (3, 0, 2)]
    assert plan_ranges({0: 5}, {0: 5}) == []


def test_cap_shares_the_batch_between_partitions_with_backlog():
    assert cap_ends({0: 0, 1: 100, 2: 50}, {0: 1000, 1: 100, 2: 60}, 100) == {0: 50, 1: 100, 2: 60}
    assert cap_ends({0: 0}, {0: 3}, 100) == {0: 3}
    assert cap_ends({0: 0, 1: 0, 2: 0}, {0: 9, 1: 9, 2: 9}, 1) == {0: 1, 1: 1, 2: 1}  # progress always


def test_options_need_bootstrap_and_topic_and_pass_kafka_settings_through():
    with pytest.raises(KafkaReadError, match="'topic'"):
        settings_from_options({"bootstrap": "b:9092"})
    settings = settings_from_options({
        "bootstrap": "b:9092", "topic": "t", "kafka.security.protocol": "SSL", "readTimeoutSeconds": "5",
    })
    config = settings.consumer_config("x")
    assert config["security.protocol"] == "SSL"
    assert config["isolation.level"] == "read_committed"
    assert settings.read_timeout_seconds == 5
    with pytest.raises(KafkaReadError, match="isolationLevel"):
        settings_from_options({"bootstrap": "b", "topic": "t", "isolationLevel": "dirty"})


def test_stream_reader_validates_options_and_pickles_without_a_consumer():
    with pytest.raises(KafkaReadError, match="maxRecordsPerBatch"):
        KafkaStreamReader({"bootstrap": "b", "topic": "t", "maxRecordsPerBatch": "0"})
    reader = KafkaStreamReader({"bootstrap": "127.0.0.1:1", "topic": "t", "maxRecordsPerBatch": "10"})
    clone = pickle.loads(pickle.dumps(reader))  # Spark ships the reader to its tasks
    assert isinstance(clone, KafkaStreamReader)
    part = pickle.loads(pickle.dumps(OffsetRange(3, 10, 20)))
    assert (part.partition, part.start, part.end) == (3, 10, 20)
