"""`benchmarks.bench_ledger.produce_as`: the mapping benchmark's three topics hold the same records
in the same partitions and batches, and differ only in each record's key and headers."""

from typing import Any

import orjson
import pytest
from benchmarks import bench_ledger
from benchmarks.bench_ledger import MAPPING_KINDS, PARTITIONS, produce_as

from keyrange.loadgen import LoadShape, Scheduled, generate
from keyrange.ranges.slots import partition_for_client

BATCH_EVERY = 120


class RecordingProducer:
    """What a producer was asked to send, and where the flushes fell (one batch per partition each)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.flushed_after: list[int] = []

    def produce(self, topic: str, value: bytes, key: bytes, **kwargs: Any) -> None:
        self.sent.append({"topic": topic, "value": value, "key": key, **kwargs})

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        self.flushed_after.append(len(self.sent))
        return 0


def commands(count: int) -> list[Scheduled]:
    return list(generate(LoadShape(clients=50, duplicate_ratio=0.01, ledger=True, seed=3), count=count))


def written_as(kind: str, monkeypatch: pytest.MonkeyPatch, records: list[Scheduled]
               ) -> tuple[RecordingProducer, dict[str, Any]]:
    producer = RecordingProducer()
    settings: dict[str, Any] = {}

    def make_producer(_bootstrap: str, **tuning: Any) -> RecordingProducer:
        settings.update(tuning)
        return producer

    monkeypatch.setattr(bench_ledger, "make_producer", make_producer)
    monkeypatch.setattr(bench_ledger, "MAPPING_BATCH_EVERY", BATCH_EVERY)  # fewer records to check
    produce_as(kind, "unused:9092", f"topic-{kind}", records)
    return producer, settings


def test_the_kinds_differ_only_in_key_and_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    records = commands(BATCH_EVERY + 50)
    written = {kind: written_as(kind, monkeypatch, records) for kind in MAPPING_KINDS}
    default, default_settings = written["default"]
    for kind, (producer, settings) in written.items():
        assert settings == default_settings
        assert producer.flushed_after == default.flushed_after
        assert len(producer.sent) == len(default.sent) > BATCH_EVERY
        for mine, theirs in zip(producer.sent, default.sent, strict=True):
            assert (mine["value"], mine["partition"], mine["timestamp"]) == (
                theirs["value"], theirs["partition"], theirs["timestamp"])
            body = orjson.loads(mine["value"])
            assert mine["partition"] == partition_for_client(body["clientId"], PARTITIONS)
            if kind == "default":
                assert mine["key"] == str(body["clientId"]).encode() and mine["headers"] is None
            else:
                assert mine["headers"] == [("event-id", body["uuid"].encode())]
                key = f"user-{body['clientId']}" if kind == "mapped" else str(body["clientId"])
                assert mine["key"] == key.encode()


def test_a_flush_cuts_the_batches_every_so_many_records(monkeypatch: pytest.MonkeyPatch) -> None:
    producer, settings = written_as("mapped", monkeypatch, commands(2 * BATCH_EVERY + 1))
    assert producer.flushed_after[:2] == [BATCH_EVERY, 2 * BATCH_EVERY]
    assert producer.flushed_after[-1] == len(producer.sent)
    assert settings["linger.ms"] >= 10_000  # the linger never cuts a batch before the flush


def test_an_unknown_kind_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        written_as("avro", monkeypatch, commands(1))
