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
(tansu commits, torn, what a dead owner left open: see docs/kafka.md and restore.py.) Each
producer has its own thread because a commit blocks until the broker acknowledges; slots commit
in parallel. What a failed call means, and the waits between tries, come from kafkaquirks.py.

A slot's release need not wait for its transaction in flight to end before committing what
finished since: until that transaction starts to end, more records and newer offsets may `join`
it, and one commit ends both (each transaction is a few round trips to a starved broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from keyrange.events import MAX_EVENT_BYTES
from keyrange.kafkaquirks import (
    Backoff,
    Failure,
    classify,
    kafka_error,
    outputs_acknowledged_before_offsets,
    transactions_end_one_at_a_time,
)
from keyrange.kafkaquirks import TransactionFailed as TransactionFailed  # its home; re-exported for the worker
from keyrange.worker.callthread import CallThread
from keyrange.worker.consumer import worker_client_id
from keyrange.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

PRODUCER_MAX_MESSAGE_BYTES = 2 * MAX_EVENT_BYTES + 100_000
"""librdkafka's own limit on one record (`message.max.bytes`), whatever the topic allows: room for
a dead letter just over the input limit (outputs.py checks every output against it)."""
TRANSACTION_TIMEOUT_MS = 60_000
"""transaction.timeout.ms of every slot's producer (see `SlotTransactions._create`)."""
COMMIT_DEADLINE_SECONDS = 40.0
"""How long one slot's transaction may take, its tries included, before the worker gives its
producer up (TransactionFailed, gave_up): the slot is then released without committing and
acquired again, by a fresh producer whose init_transactions fences this one and aborts what it
left open. An outage shorter than about this is waited out in place (the first flush waits the
client timeout, 30 s, then one more try fits); past it a fresh producer beats waiting, as one whose
broker restarted may never get a usable connection back (docs/kafka.md). Shorter than the
transaction timeout, after which the broker aborts the transaction anyway."""
CONNECT_TIMEOUT_SECONDS = 5.0
"""How long a slot's producer waits for a broker connection before `init_transactions` (which
then waits on its own, retrying)."""
OFFSETS_TIMEOUT_SECONDS = 10.0
"""How long one send_offsets_to_transaction may take (a retriable timeout is tried again)."""
CALL_STUCK_SECONDS = 5.0
"""How long past its own timeout a producer call may go on before it counts as never returning
(librdkafka can leave a request to a coordinator that died unanswered for good: docs/kafka.md).
The call is then left to its thread and its producer given up; a whole commit likewise,
COMMIT_DEADLINE_SECONDS + this after it began."""

class CommitRetry:
    """Waits between tries of one slot's transaction (kafkaquirks' Backoff), one log line each, and
    keeps the transaction's deadline (COMMIT_DEADLINE_SECONDS from the first try).

    It gives up (TransactionFailed) at a failure once `give_up` is set (the worker stops: a SIGTERM
    must not wait for Kafka to come back, but a commit that works still commits), before any call
    once `abandoned` is set (the worker gave this producer up), or at the deadline: each call's
    timeout is cut to what is left of it (`timeout`), and a failure or a call that would start
    after it ends the transaction. The slot's next acquire (in place, by its owner, or by its next
    worker) starts a fresh producer and restores from what committed."""

    def __init__(self, who: str, give_up: threading.Event, abandoned: threading.Event,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.who = who
        self.give_up = give_up
        self.abandoned = abandoned
        self.tries = 0
        self._waits = Backoff(clock=clock)
        self._clock = clock
        self.deadline = clock() + COMMIT_DEADLINE_SECONDS

    def failed(self, why: str) -> None:
        """A try failed: wait before the next one, or raise TransactionFailed if none may follow."""
        self.tries += 1
        if self.give_up.is_set() or self.abandoned.is_set():
            raise self._given_up(why)
        if self._clock() >= self.deadline:
            raise TransactionFailed(f"{self.who}: {why}, still failing after {self.tries} tries over "
                                    f"{COMMIT_DEADLINE_SECONDS:g} s: giving this producer up; the slot resumes from "
                                    "the last committed offsets", gave_up=True)
        delay = self._waits.failed()
        log.warning("%s: %s; Kafka may be unavailable: trying again in %.1f s (try %d)", self.who, why,
                    delay, self.tries)
        self.give_up.wait(min(delay, self.deadline - self._clock()))

    def timeout(self, longest: float, what: str) -> float:
        """The timeout of the next call (`what`): `longest`, cut to what is left of the deadline;
        TransactionFailed if nothing is left, or the worker gave this producer up."""
        if self.abandoned.is_set():
            raise self._given_up(f"{what} not started")
        left = self.deadline - self._clock()
        if left <= 0:
            raise TransactionFailed(f"{self.who}: no commit within {COMMIT_DEADLINE_SECONDS:g} s ({self.tries} "
                                    f"failed tries; {what} not started): giving this producer up; the slot "
                                    "resumes from the last committed offsets", gave_up=True)
        return min(longest, left)

    def _given_up(self, why: str) -> TransactionFailed:
        return TransactionFailed(f"{self.who}: {why}, and the worker is stopping or gave this producer up: not "
                                 "trying again; its uncommitted events run again from the last committed offsets",
                                 gave_up=True)

    def recovered(self) -> None:
        if self.tries:
            log.warning("%s: the transaction committed after %d tries", self.who, self.tries + 1)


@dataclass(slots=True)
class OutputRecord:
    """One record to write in the next transaction (not frozen: built once per event, hot path)."""

    topic: str
    partition: int | None
    """None lets the producer pick (murmur2 on the key), used when partition counts differ."""
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None
    delivered: Callable[[KafkaError | None, Message], None] | None = None
    """Told of the record's delivery (librdkafka's on_delivery), before its transaction's commit
    returns: e.g. where a changelog snapshot starts (snapshots.py)."""


@dataclass(frozen=True, slots=True)
class Addition:
    """Records and offsets that joined a transaction in flight (`SlotTransactions.join`)."""

    records: list[OutputRecord]
    offsets: list[TopicPartition]
    last: list[OutputRecord]


def newer_offsets(older: list[TopicPartition], newer: list[TopicPartition]) -> list[TopicPartition]:
    """`older` with each partition's offset replaced by `newer`'s where it has one."""
    merged = {(tp.topic, tp.partition): tp for tp in older}
    merged.update({(tp.topic, tp.partition): tp for tp in newer})
    return list(merged.values())


def _with_joined(joined: Addition | None, records: list[OutputRecord], offsets: list[TopicPartition],
                 last: list[OutputRecord]) -> tuple[list[OutputRecord], list[TopicPartition], list[OutputRecord]]:
    """The transaction's whole records, offsets and last records once `joined` joined it."""
    if joined is None:
        return records, offsets, last
    return records + joined.records, newer_offsets(offsets, joined.offsets), last + joined.last


class SlotTransactions:
    """Writes one slot's batches of OutputRecords plus its offset commit in Kafka transactions."""

    def __init__(self, settings: WorkerSettings, slot: int, group_metadata: Any,
                 make_producer: Callable[[dict[str, Any]], Producer] = Producer,
                 batch_bytes: int | None = None, end_lock: Path | None = None) -> None:
        self._settings = settings
        self._end_lock = end_lock
        """The lock its transactions end under (kafkaquirks.transaction_end_lock of its output partition)."""
        self._batch_bytes = batch_bytes
        """librdkafka's batch.size, when the output topics need one below its default (outputs.py)."""
        self._make_producer = make_producer
        self.slot = slot
        self.transactional_id = settings.slot_transactional_id(slot)
        self._group_metadata = group_metadata
        self._executor = CallThread(f"keyrange-slot-{slot}")
        """Every call of the producer, in order; a daemon thread, so that one left in a call that
        does not return does not hold up the process's exit."""
        self._producer: Producer | None = None
        self._initialised = False
        self._give_up = threading.Event()
        self._transaction_failed = False
        """A commit raised TransactionFailed: what the producer still holds is discarded unsent."""
        self._abandoned = threading.Event()
        """A call of the producer did not return (see `_send_offsets` and `commit`): the producer is
        given up, not touched again, and nothing waits behind the call."""
        self._joining = threading.Lock()
        self._joinable = False
        """A transaction is in flight and has not started to end: `join` adds to it."""
        self._additions: list[Addition] = []
        """What joined the transaction in flight and it has not yet written."""
        # Created now (connections and metadata warm up while the slot is still read ahead), but
        # initialised only by `open`: initialising fences the slot's current owner.
        self._created = self._executor.submit(self._create)

    def _create(self) -> None:
        s = self._settings
        self._producer = self._make_producer(s.clients.transactional_producer(
            self.transactional_id,
            # The broker aborts (and fences) a transaction open longer than this. A slot gives its
            # producer up sooner (COMMIT_DEADLINE_SECONDS), and a killed worker's open transaction
            # is aborted at once by the slot's next owner anyway (its init_transactions), so this
            # only bounds how long an orphaned one holds back read_committed readers (e.g. the
            # aggregation) when nobody takes the slot over.
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            tuning={"client.id": worker_client_id(s, f"slot-{self.slot}"),
                    # A request to a frozen broker is sent again to the new leader after 10 s, not
                    # librdkafka's 30-60 s (BENCHMARKS.md); safe: the producer is idempotent.
                    "request.timeout.ms": 10_000, "socket.timeout.ms": 10_000,
                    "linger.ms": 5,
                    "message.max.bytes": PRODUCER_MAX_MESSAGE_BYTES,
                    **({"batch.size": self._batch_bytes} if self._batch_bytes is not None else {})},
        ))
        # Connected now, not at `open`: a read-ahead's producer waits for its first connection while
        # the old owner still works.
        self._connect(self._producer)

    async def open(self) -> None:
        """Initialise the slot's transactional id: fences every earlier producer of the slot and
        resolves the transaction it left open (aborted on Kafka; committed as is on tansu)."""

        def init() -> None:
            self._created.result()
            assert self._producer is not None
            try:
                self._ending(self._producer.init_transactions, self._settings.kafka_timeout_seconds)
            except (KafkaException, SystemError) as exc:
                raise TransactionFailed(f"cannot initialise {self.transactional_id}: {kafka_error(exc)}") from exc
            self._initialised = True

        await asyncio.get_running_loop().run_in_executor(self._executor, init)

    def _connect(self, producer: Producer) -> None:
        """Have a broker connection up before `init_transactions`, which otherwise waits a fixed
        500 ms for the coordinator when none is (most of a handoff's pause: BENCHMARKS.md).

        Two metadata requests of the sink topic: the first is answered over the bootstrap
        connection, which librdkafka drops once the answer names the brokers; the second waits
        until a connection to a named broker is up."""
        timeout = min(CONNECT_TIMEOUT_SECONDS, self._timeout)
        try:
            producer.list_topics(self._settings.sink, timeout=timeout)
            producer.list_topics(self._settings.sink, timeout=timeout)
        except KafkaException as exc:
            log.debug("slot %d: no metadata before initialising (%s); init_transactions retries", self.slot, exc)

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        """Write `records` and commit `offsets` atomically; raise TransactionFailed if impossible
        (fenced: another worker acquired the slot), or not done within COMMIT_DEADLINE_SECONDS.

        The deadline is kept by the commit's own thread (`CommitRetry`); should a producer call
        ignore its timeout, this gives the producer up CALL_STUCK_SECONDS later all the same,
        leaving the call to its thread, so that no slot waits on a producer for longer.

        `last`: records that say where the slot's position is (a hash-range slot's totals record,
        as offsets do for a whole partition): written only once `records` were acknowledged.

        Until the transaction starts to end, `join` may add to it (module docstring)."""
        with self._joining:
            self._joinable, self._additions = True, []
        running = asyncio.get_running_loop().run_in_executor(self._executor, self._commit, records, offsets,
                                                             last or [])
        longest = COMMIT_DEADLINE_SECONDS + CALL_STUCK_SECONDS
        try:
            await asyncio.wait_for(asyncio.shield(running), longest)
        except TransactionFailed:
            self._transaction_failed = True
            raise
        except TimeoutError:
            self._abandoned.set()  # the thread starts no other call once this one returns
            self._give_up.set()  # nor waits out its backoff
            running.add_done_callback(lambda done: done.cancelled() or done.exception())  # ends as it may
            raise TransactionFailed(
                f"slot {self.slot}: its transaction did not end within {longest:g} s "
                "(a producer call did not return within its timeout): giving this producer up; the slot resumes "
                "from the last committed offsets", gave_up=True) from None

    def join(self, records: list[OutputRecord], offsets: list[TopicPartition],
             last: list[OutputRecord] | None = None) -> bool:
        """Add `records`, `offsets` and `last` (as `commit` takes them, and newer than what it
        carries) to the transaction in flight, if it has not started to end: then it writes them
        after its own, and they commit or fail with it; returns whether they joined. Any thread."""
        with self._joining:
            if not self._joinable:
                return False
            self._additions.append(Addition(records, offsets, last or []))
            return True

    def _joined(self, end: bool) -> Addition | None:
        """What joined the transaction since the last call, merged in order; with `end`, nothing
        may join any more (its commit follows)."""
        with self._joining:
            additions, self._additions = self._additions, []
            if end:
                self._joinable = False
        if not additions:
            return None
        offsets: list[TopicPartition] = []
        for a in additions:
            offsets = newer_offsets(offsets, a.offsets)
        return Addition([r for a in additions for r in a.records], offsets, [r for a in additions for r in a.last])

    def _commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                last: list[OutputRecord] | None = None) -> None:
        try:
            self._commit_joined(records, offsets, last or [])
        finally:
            with self._joining:
                self._joinable = False  # failed or committed: nothing may join it after

    def _commit_joined(self, records: list[OutputRecord], offsets: list[TopicPartition],
                       last: list[OutputRecord]) -> None:
        producer = self._producer
        if producer is None or not self._initialised:
            raise TransactionFailed(f"{self.transactional_id} is not open")
        # Transient trouble (the broker away, a coordinator moving, a transaction timed out by
        # the broker) is waited out: aborted if it must be, then the same batch again, with a
        # backoff and one log line per try. Only a fatal or fencing error gives up.
        retry = CommitRetry(f"slot {self.slot}", self._give_up, self._abandoned)
        while True:
            try:
                producer.begin_transaction()
                for r in records:
                    self._produce(producer, r)
                # What joined by now goes out with the transaction's own position, in one round trip.
                # It is part of the batch before it is produced: a retry writes it again.
                joined = self._joined(end=False)
                records, offsets, last = _with_joined(joined, records, offsets, last)
                self._produce_joined(producer, joined)
                if offsets or last:
                    self._flush_then_position(producer, retry, offsets, last)
                joined = self._joined(end=True)
                records, offsets, last = _with_joined(joined, records, offsets, last)
                self._produce_joined(producer, joined)
                if joined is not None and (joined.offsets or joined.last):
                    self._flush_then_position(producer, retry, joined.offsets, joined.last)
                self._retrying(retry, "committing", self._timeout,
                               lambda timeout: self._ending(producer.commit_transaction, timeout))
                retry.recovered()
                return
            except (KafkaException, SystemError) as exc:
                error = kafka_error(exc)
                if classify(error) in (Failure.FENCED, Failure.CONFLICT, Failure.FATAL):
                    raise self._failed(error, len(records)) from exc
                retry.failed(f"the transaction was aborted ({error})")
                try:
                    self._retrying(retry, "aborting", self._timeout,
                                   lambda timeout: self._ending(producer.abort_transaction, timeout))
                except (KafkaException, SystemError) as abort_exc:
                    raise self._failed(kafka_error(abort_exc), len(records)) from abort_exc

    def _produce_joined(self, producer: Producer, joined: Addition | None) -> None:
        """Produce the records that `joined` the transaction."""
        for r in [] if joined is None else joined.records:
            self._produce(producer, r)

    def _flush_then_position(self, producer: Producer, retry: CommitRetry, offsets: list[TopicPartition],
                             last: list[OutputRecord]) -> None:
        outputs_acknowledged_before_offsets(lambda: self._flush(producer, retry),
                                            lambda: self._position(producer, retry, offsets, last))

    def _ending(self, end: Callable[[float], object], timeout: float) -> None:
        """`end(timeout)`, a call that ends a transaction (init_transactions ends the one a previous
        producer left open), while no other producer of the slot's output partition on this host
        ends one (a tansu workaround: kafkaquirks.transactions_end_one_at_a_time)."""
        with transactions_end_one_at_a_time(self._end_lock, timeout):
            end(timeout)

    def _position(self, producer: Producer, retry: CommitRetry, offsets: list[TopicPartition],
                  last: list[OutputRecord]) -> None:
        for r in last:
            self._produce(producer, r)
        if offsets:
            self._retrying(retry, "sending its offsets", OFFSETS_TIMEOUT_SECONDS,
                           lambda timeout: self._send_offsets(producer, offsets, timeout))

    def _send_offsets(self, producer: Producer, offsets: list[TopicPartition], timeout: float) -> None:
        """send_offsets_to_transaction, on a thread of its own so that a call that never returns
        (CALL_STUCK_SECONDS past `timeout`) gives this producer up (TransactionFailed) instead of
        the slot's commits, and the worker's stop, waiting for it forever. The slot's next acquire
        starts a fresh producer of its transactional id: the stuck one is fenced, and left to its
        thread."""
        outcome: list[BaseException | None] = []
        returned = threading.Event()

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, self._group_metadata, timeout)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the commit's thread
                outcome.append(exc)
            returned.set()

        # A daemon thread: one stuck in librdkafka for good must not hold up the process's exit.
        threading.Thread(target=call, name=f"keyrange-slot-{self.slot}-offsets", daemon=True).start()
        if not returned.wait(timeout + CALL_STUCK_SECONDS):
            self._abandoned.set()
            raise TransactionFailed(
                f"slot {self.slot}: sending its offsets to the transaction did not return within "
                f"{timeout + CALL_STUCK_SECONDS:g} s (librdkafka leaves a request to a group coordinator that left the "
                "cluster unanswered): giving this producer up; the slot resumes from the last committed offsets",
                gave_up=True)
        if outcome[0] is not None:
            raise outcome[0]

    def _failed(self, error: KafkaError, records: int) -> TransactionFailed:
        failure = classify(error)
        if failure is Failure.FENCED:
            why = (f"slot {self.slot} was acquired by another worker (its transactional id fenced this one), "
                   f"or Kafka was away longer than the transaction timeout ({TRANSACTION_TIMEOUT_MS // 1000} s) "
                   "and aborted the transaction")
        elif failure is Failure.CONFLICT:
            # Retrying (an abort) would spin forever behind the call that never ends.
            why = f"slot {self.slot}'s producer is stuck behind a transactional call that did not finish"
        else:
            why = f"transaction of {records} records of slot {self.slot} failed"
        return TransactionFailed(
            f"{why}: {error}; the slot resumes from the last committed offsets"
        )

    def stop_retrying(self) -> None:
        """Make a commit that waits for Kafka give up at its next retry (raising TransactionFailed)
        instead of waiting on: the worker stops, and what did not commit runs again elsewhere."""
        self._give_up.set()

    @property
    def _timeout(self) -> float:
        return self._settings.kafka_timeout_seconds

    @staticmethod
    def _retrying(retry: CommitRetry, what: str, longest: float, call: Callable[[float], object]) -> None:
        """`call(timeout)` until it succeeds, waiting out retriable errors; others are raised. Each
        try's timeout is `longest`, cut to what is left of the transaction's deadline."""
        while True:
            try:
                call(retry.timeout(longest, what))
                return
            except (KafkaException, SystemError) as exc:
                error = kafka_error(exc)
                if classify(error) is not Failure.RETRIABLE:
                    raise
                retry.failed(f"{what} failed ({error})")

    def _flush(self, producer: Producer, retry: CommitRetry) -> None:
        # Outputs not acknowledged in time keep being retried by librdkafka until their message
        # timeout; then they fail, and the transaction needs an abort (raised by the next call).
        while True:
            timeout = retry.timeout(self._timeout, "flushing its outputs")
            if producer.flush(timeout) == 0:
                return
            retry.failed(f"outputs not acknowledged within {timeout:.3g} s")

    @staticmethod
    def _produce(producer: Producer, r: OutputRecord) -> None:
        kwargs: dict[str, Any] = {"key": r.key, "value": r.value}
        if r.partition is not None:
            kwargs["partition"] = r.partition
        if r.headers:
            kwargs["headers"] = r.headers
        if r.delivered is not None:
            kwargs["on_delivery"] = r.delivered
        while True:
            try:
                producer.produce(r.topic, **kwargs)
                return
            except BufferError:
                producer.poll(0.01)

    async def close(self) -> None:
        """Release the producer and its thread (the engine committed or discarded what the slot had)."""
        if self._abandoned.is_set():
            # Not through the executor, whose thread may still be in the call: the producer is left
            # to that thread (and dropped there, not on the event loop), its transactional id fenced
            # by the slot's next producer.
            self._producer = None
            self._executor.shutdown(wait=False)
            return

        def close() -> None:
            with contextlib.suppress(Exception):
                self._created.result()
            producer, self._producer = self._producer, None
            # A producer whose transaction failed is not flushed: its outputs are discarded with
            # the transaction, and with Kafka away the flush would only wait out its timeout.
            if producer is not None and not self._transaction_failed:
                with contextlib.suppress(KafkaException):  # a fenced producer raises its fatal error
                    producer.flush(5.0)

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=False)
