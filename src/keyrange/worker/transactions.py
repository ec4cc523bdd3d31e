"""Per-slot transactions: a slot's outputs, state changes and offset commit together, and only
the slot's current owner can commit.

Each slot (input partition) has a transactional producer of its own whose transactional.id is
derived from the consumer group and the slot (`keyrange-<group>-slot-<p>`), like Kafka Streams'
first exactly-once design. Whoever acquires a slot initialises that id first: the broker then
fences every earlier producer of it (a zombie worker that was paused, a worker that followed a
stale controller), aborts the transaction it left open, and rejects its later writes and offset
commits. So two workers can never both commit a slot, whatever the epoch protocol believes; and
the ids stay meaningful when a slot becomes a hash range inside a partition (one id per range,
its offsets kept with its outputs instead of the group's committed offsets).

Every commit interval the committer hands each slot the records finished since its last
transaction (processed records, dead letters, state changelog records, the totals record) and
its committable offset; they commit atomically, so after a crash either all of them are visible
(read_committed) and the offset is past the events, or none are and the events run again.
(On tansu a fenced or crashed owner's open transaction is committed, torn, by the next
`init_transactions` instead of aborted: see `_commit` and restore.py.) Each producer has its own
thread because a commit blocks until the broker acknowledges; slots commit in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """A slot's producer hit a fatal error, e.g. fenced because another worker acquired the slot."""


@dataclass(slots=True)
class OutputRecord:
    """One record to write in the next transaction (not frozen: built once per event, hot path)."""

    topic: str
    partition: int | None
    """None lets the producer pick (murmur2 on the key), used when partition counts differ."""
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


class SlotTransactions:
    """Writes one slot's batches of OutputRecords plus its offset commit in Kafka transactions."""

    def __init__(self, settings: WorkerSettings, slot: int, group_metadata: Any) -> None:
        self._settings = settings
        self.slot = slot
        self.transactional_id = settings.slot_transactional_id(slot)
        self._group_metadata = group_metadata
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"keyrange-slot-{slot}")
        self._producer: Producer | None = None
        self._initialised = False
        # Created now (connections and metadata warm up while the slot is still read ahead), but
        # initialised only by `open`: initialising fences the slot's current owner.
        self._created = self._executor.submit(self._create)

    def _create(self) -> None:
        s = self._settings
        self._producer = Producer(s.clients.transactional_producer(
            self.transactional_id,
            # Short, so that a transaction a killed worker left open stops holding back
            # read_committed readers soon even if nobody acquires the slot (the next owner's
            # init_transactions aborts it at once).
            transaction_timeout_ms=10_000,
            tuning={"linger.ms": 5,
                    # Dead letters carry the original value, which may be just over the input limit.
                    "message.max.bytes": 2 * MAX_EVENT_BYTES + 100_000},
        ))

    async def open(self) -> None:
        """Initialise the slot's transactional id: fences every earlier producer of the slot and
        resolves the transaction it left open (aborted on Kafka; committed as is on tansu)."""

        def init() -> None:
            self._created.result()
            assert self._producer is not None
            try:
                self._producer.init_transactions(self._settings.kafka_timeout_seconds)
            except KafkaException as exc:
                raise TransactionFailed(f"cannot initialise {self.transactional_id}: {exc.args[0]}") from exc
            self._initialised = True

        await asyncio.get_running_loop().run_in_executor(self._executor, init)

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition]) -> None:
        """Write `records` and commit `offsets` atomically; raise TransactionFailed if impossible
        (fenced: another worker acquired the slot)."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._commit, records, offsets)

    def _commit(self, records: list[OutputRecord], offsets: list[TopicPartition]) -> None:
        producer = self._producer
        if producer is None or not self._initialised:
            raise TransactionFailed(f"{self.transactional_id} is not open")
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
                    fenced = error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                              KafkaError.INVALID_PRODUCER_EPOCH)
                    why = (f"slot {self.slot} was acquired by another worker (its transactional id fenced this "
                           "one)" if fenced else f"transaction of {len(records)} records of slot {self.slot} failed")
                    raise TransactionFailed(
                        f"{why}: {error}; the worker stops so that a restart (or the slot's owner) resumes from "
                        "the last committed offsets"
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
        """Release the producer and its thread (the engine committed or discarded what the slot had)."""

        def close() -> None:
            with contextlib.suppress(Exception):
                self._created.result()
            producer, self._producer = self._producer, None
            if producer is not None:
                producer.flush(5.0)

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=False)
