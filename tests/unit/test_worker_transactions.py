"""What one output transaction carries, and in what order it reaches the producer (no Kafka)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from keyrange.events import SOURCE_OFFSET_HEADER
from keyrange.worker.partition import PartitionMetrics, PartitionState
from keyrange.worker.rebuild import RestoredPartition
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.transactions import OutputRecord, SlotTransactions, TransactionFailed

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0")


class RecordingProducer:
    """Stands in for confluent's Producer: records the calls a transaction makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.calls.append(f"produce {topic}")

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        return 0

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls.append("send_offsets")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def list_topics(self, topic: str, timeout: float) -> None:
        self.calls.append(f"metadata {topic}")

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")


def open_slot(slot: int, producer: RecordingProducer) -> SlotTransactions:
    """A slot's transactions, initialised, writing through `producer` instead of Kafka."""
    output = SlotTransactions(SETTINGS, slot, group_metadata=None)
    output._created.result()
    output._producer = producer  # type: ignore[assignment]
    output._initialised = True
    return output


def test_offsets_join_the_transaction_only_after_every_output_was_acknowledged() -> None:
    producer = RecordingProducer()
    output = open_slot(0, producer)
    records = [OutputRecord("events.processed", 0, b"1", b"{}"), OutputRecord("g.state", 0, b"1", b"5")]
    output._commit(records, [TopicPartition("events", 0, 10)])
    assert producer.calls == ["begin", "produce events.processed", "produce g.state", "flush",
                              "send_offsets", "commit"]


def test_a_slot_is_initialised_over_a_broker_connection_already_up() -> None:
    """librdkafka asks for the transaction coordinator only over a connection that is up, and
    otherwise tries again after a fixed 500 ms: most of a handoff's pause on Apache Kafka."""
    producer = RecordingProducer()
    output = SlotTransactions(SETTINGS, 3, group_metadata=None)
    output._created.result()
    output._producer = producer  # type: ignore[assignment]
    asyncio.run(output.open())
    assert producer.calls == ["metadata events.processed", "init"]


def test_changelog_records_carry_the_source_offset_of_the_last_change() -> None:
    ps = PartitionState(3, RestoredPartition(0), 10.0, time.time, PartitionMetrics("c", "w0", 3),
                        transactions=None)  # type: ignore[arg-type]  # no transaction in this test
    ps.dirty_state[1001] = (b"7", 12)
    ps.dirty_state[1001] = (b"9", 15)
    ps.dirty_state[1002] = (None, 14)
    records, _, _ = ps.take_outputs("g.state")
    assert [(r.topic, r.partition, r.key, r.value, r.headers) for r in records] == [
        ("g.state", 3, b"1001", b"9", [(SOURCE_OFFSET_HEADER, b"15")]),
        ("g.state", 3, b"1002", None, [(SOURCE_OFFSET_HEADER, b"14")]),
    ]


def test_each_slot_has_its_own_transactional_id_whoever_holds_it() -> None:
    ids = {SETTINGS.slot_transactional_id(slot) for slot in range(12)}
    other_worker = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w7")
    assert len(ids) == 12 and other_worker.slot_transactional_id(3) == SETTINGS.slot_transactional_id(3)
    assert SETTINGS.slot_transactional_id(3) == "keyrange-g-slot-3"


class StuckProducer(RecordingProducer):
    """A producer fenced while a commit was in flight (a frozen zombie): librdkafka answers every
    other transactional call with _CONFLICT, flagged retriable, for as long as the process lives."""

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        raise KafkaException(KafkaError(KafkaError._CONFLICT, "Conflicting commit_transaction API call is already "
                                        "in progress"))

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        raise KafkaException(KafkaError(KafkaError._CONFLICT, "Conflicting commit_transaction API call is already "
                                        "in progress", retriable=True))


def test_a_producer_stuck_behind_an_unfinished_call_fails_the_slot_instead_of_retrying_forever() -> None:
    producer = StuckProducer()
    output = open_slot(5, producer)
    outcome: list[BaseException] = []

    def commit() -> None:
        try:
            output._commit([OutputRecord("events.processed", 5, b"1", b"{}")], [TopicPartition("events", 5, 10)])
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    worker = threading.Thread(target=commit, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), f"still retrying after 20 s: {producer.calls[-5:]}"
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed), outcome
    assert "stuck behind a transactional call" in str(outcome[0])
