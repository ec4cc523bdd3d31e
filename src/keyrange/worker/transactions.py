"""One transactional producer per worker: outputs, state changes and offsets commit together.

Every commit interval the engine hands over the records finished since the last transaction
(processed records, dead letters, state changelog records) and each partition's committable
offset; they commit atomically, so after a crash either all of them are visible
(read_committed) and the offset is past the events, or none are and the events run again.
(On tansu a crashed worker's transaction can become visible torn: see `_commit` and restore.py.)
The producer runs on its own thread because commit blocks until the broker acknowledges.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from keyrange.events import MAX_EVENT_BYTES
from keyrange.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

ABORT_RETRIES = 5
"""Times a batch is re-sent in a fresh transaction after an abortable error before giving up."""


class TransactionFailed(RuntimeError):
    """The producer hit a fatal error (e.g. fenced by a newer worker with the same id)."""


@dataclass(slots=True)
class OutputRecord:
    """One record to write in the next transaction (not frozen: built once per event, hot path)."""

    topic: str
    partition: int | None
    """None lets the producer pick (murmur2 on the key), used when partition counts differ."""
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


class TransactionalOutput:
    """Writes batches of OutputRecords plus consumer offsets in Kafka transactions."""

    def __init__(self, settings: WorkerSettings, group_metadata: Any) -> None:
        self._settings = settings
        self._group_metadata = group_metadata
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keyrange-producer")
        self._producer: Producer | None = None

    async def open(self) -> None:
        """Create the producer and init transactions (this aborts what a crashed predecessor left open)."""
        s = self._settings

        def init() -> None:
            self._producer = Producer(s.clients.transactional_producer(
                s.transactional_id,
                # Short, so that a transaction a killed worker left open stops holding back
                # read_committed readers (the next owner's restore) well within its timeout;
                # a restart with the same worker id aborts it at once anyway (init_transactions).
                transaction_timeout_ms=10_000,
                tuning={"linger.ms": 5,
                        # Dead letters carry the original value, which may be just over the input limit.
                        "message.max.bytes": 2 * MAX_EVENT_BYTES + 100_000},
            ))
            self._producer.init_transactions(s.kafka_timeout_seconds)

        await asyncio.get_running_loop().run_in_executor(self._executor, init)

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition]) -> None:
        """Write `records` and commit `offsets` atomically; raise TransactionFailed if impossible."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._commit, records, offsets)

    def _commit(self, records: list[OutputRecord], offsets: list[TopicPartition]) -> None:
        producer = self._producer
        if producer is None:
            raise TransactionFailed("the transactional producer is not open")
        timeout = self._settings.kafka_timeout_seconds
        for attempt in range(1, ABORT_RETRIES + 1):
            try:
                producer.begin_transaction()
                for r in records:
                    self._produce(producer, r)
                if offsets:
                    # tansu workaround: offsets only after every output was acknowledged. Kafka
                    # commits or aborts a transaction whole, so this changes nothing there; but tansu's
                    # init_transactions COMMITS what a killed predecessor left open, i.e. the
                    # per-partition prefixes librdkafka had delivered. Flushing first means that
                    # if those offsets become visible, so did every output before them (no loss);
                    # restore.py copes with the torn prefixes of outputs and changelog.
                    self._flush(producer, timeout)
                    producer.send_offsets_to_transaction(offsets, self._group_metadata, timeout)
                self._commit_transaction(producer, timeout)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.fatal() or not error.txn_requires_abort():
                    raise TransactionFailed(
                        f"transaction of {len(records)} records failed: {error}; the worker stops so "
                        "that a restart (or the new owner) resumes from the last committed offsets"
                    ) from exc
                log.warning("transaction aborted (attempt %d/%d): %s", attempt, ABORT_RETRIES, error)
                producer.abort_transaction(timeout)
        raise TransactionFailed(f"transaction aborted {ABORT_RETRIES} times in a row; giving up")

    @staticmethod
    def _flush(producer: Producer, timeout: float) -> None:
        if producer.flush(timeout) > 0:
            raise TransactionFailed(
                f"outputs not acknowledged within {timeout:g} s; the worker stops so that a restart "
                "(or the new owner) resumes from the last committed offsets"
            )

    @staticmethod
    def _commit_transaction(producer: Producer, timeout: float) -> None:
        while True:
            try:
                producer.commit_transaction(timeout)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise

    @staticmethod
    def _produce(producer: Producer, r: OutputRecord) -> None:
        kwargs: dict[str, Any] = {"key": r.key, "value": r.value}
        if r.partition is not None:
            kwargs["partition"] = r.partition
        if r.headers:
            kwargs["headers"] = r.headers
        while True:
            try:
                producer.produce(r.topic, **kwargs)
                return
            except BufferError:
                producer.poll(0.01)

    async def close(self) -> None:
        """Flush and release the producer thread (open transactions were committed by the engine)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, producer.flush, 5.0)
        self._executor.shutdown(wait=True)
