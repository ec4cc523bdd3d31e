"""What one output transaction carries, and in what order it reaches the producer (no Kafka)."""

from __future__ import annotations

import asyncio
import fcntl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from keyrange.events import SOURCE_OFFSET_HEADER
from keyrange.worker import transactions
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.transactions import OutputRecord, SlotTransactions, TransactionFailed
from tests.slotstate import held_slot, take_staged
from tests.unit.worker_fakes import FakeClock, RecordingProducer

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0")


async def opened_slot(slot: int, producer: RecordingProducer) -> SlotTransactions:
    """A slot's transactions, initialised, writing through `producer` instead of Kafka."""
    output = SlotTransactions(SETTINGS, slot, group_metadata=None, make_producer=lambda _: producer)  # type: ignore[arg-type,return-value]
    await output.open()
    producer.calls.clear()  # the connection made on creation, and the initialisation
    return output


def open_slot(slot: int, producer: RecordingProducer) -> SlotTransactions:
    """`opened_slot`, from a test without a running loop."""
    return asyncio.run(opened_slot(slot, producer))


def commit(output: SlotTransactions, records: list[OutputRecord], offsets: list[TopicPartition]) -> None:
    """Commit through the public seam, from a thread without a running loop."""
    asyncio.run(output.commit(records, offsets))


def test_offsets_join_the_transaction_only_after_every_output_was_acknowledged() -> None:
    producer = RecordingProducer()
    output = open_slot(0, producer)
    records = [OutputRecord("events.processed", 0, b"1", b"{}"), OutputRecord("g.state", 0, b"1", b"5")]
    commit(output, records, [TopicPartition("events", 0, 10)])
    assert producer.calls == ["begin", "produce events.processed", "produce g.state", "flush",
                              "send_offsets", "commit"]


def test_a_slot_is_initialised_over_a_broker_connection_already_up() -> None:
    """librdkafka asks for the transaction coordinator only over a connection that is up, and
    otherwise tries again after a fixed 500 ms: most of a handoff's pause on Apache Kafka. The
    second metadata request waits for a connection to a broker the first one named (the bootstrap
    connection is dropped); both run when the producer is created, so a read-ahead's producer is
    connected before its slot is acquired."""
    producer = RecordingProducer()
    output = SlotTransactions(SETTINGS, 3, group_metadata=None, make_producer=lambda _: producer)  # type: ignore[arg-type,return-value]
    deadline = time.monotonic() + 10
    while len(producer.calls) < 2 and time.monotonic() < deadline:  # created on the slot's thread
        time.sleep(0.01)
    assert producer.calls == ["metadata events.processed", "metadata events.processed"]
    asyncio.run(output.open())
    assert producer.calls == ["metadata events.processed", "metadata events.processed", "init"]


def test_changelog_records_carry_the_source_offset_of_the_last_change() -> None:
    slot = held_slot(3)  # no transaction in this test
    slot.change_state(1001, b"7", 12)
    slot.change_state(1001, b"9", 15)
    slot.change_state(1002, None, 14)
    staged = take_staged(slot)
    assert staged is not None and staged.outputs == []
    assert [(r.topic, r.partition, r.key, r.value, r.headers) for r in staged.changelog] == [
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

    def committing() -> None:
        try:
            commit(output, [OutputRecord("events.processed", 5, b"1", b"{}")], [TopicPartition("events", 5, 10)])
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    worker = threading.Thread(target=committing, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), f"still retrying after 20 s: {producer.calls[-5:]}"
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed), outcome
    assert "stuck behind a transactional call" in str(outcome[0])


class UnansweredOffsetsProducer(RecordingProducer):
    """After a broker outage librdkafka (2.16) can leave AddOffsetsToTxn unanswered for good: every
    send_offsets_to_transaction times out (retriable), however often it is tried."""

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls.append("send_offsets")
        time.sleep(0.05)  # stands for the call's own timeout (kafka_timeout_seconds)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Transactional API operation (send_offsets) timed out",
                                        retriable=True))


def commit_in_thread(output: SlotTransactions) -> tuple[threading.Thread, list[BaseException]]:
    outcome: list[BaseException] = []

    def committing() -> None:
        try:
            commit(output, [OutputRecord("events.processed", 5, b"1", b"{}")], [TopicPartition("events", 5, 10)])
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=committing, daemon=True)
    thread.start()
    return thread, outcome


def test_a_commit_retried_past_its_deadline_gives_its_producer_up(monkeypatch: Any) -> None:
    # The slot's next acquire starts afresh, with a producer that fences this one.
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_SECONDS", 1.5)
    producer = UnansweredOffsetsProducer()
    thread, outcome = commit_in_thread(open_slot(5, producer))
    thread.join(20)
    assert not thread.is_alive(), f"still retrying after 20 s: {producer.calls[-5:]}"
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed), outcome
    assert "giving this producer up" in str(outcome[0]) and outcome[0].gave_up
    assert producer.calls.count("send_offsets") >= 2  # it did wait out a while first


def test_a_stopping_worker_does_not_wait_for_a_commit_retrying_against_an_unavailable_kafka() -> None:
    producer = UnansweredOffsetsProducer()
    output = open_slot(5, producer)
    thread, outcome = commit_in_thread(output)
    while "send_offsets" not in producer.calls:
        time.sleep(0.01)
    output.stop_retrying()  # what Worker.stop does on SIGTERM
    thread.join(5)  # the transaction timeout (60 s) is not waited for
    assert not thread.is_alive(), f"still retrying: {producer.calls[-5:]}"
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed), outcome
    assert "the worker is stopping" in str(outcome[0])


def test_a_producer_fenced_by_kafka_is_not_one_the_worker_gave_up() -> None:
    class FencedProducer(RecordingProducer):
        def commit_transaction(self, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._FENCED, "Producer fenced by newer instance", fatal=True))

    thread, outcome = commit_in_thread(open_slot(5, FencedProducer()))
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed) and not outcome[0].gave_up, outcome


class FencedMidTransactionProducer(RecordingProducer):
    """A producer fenced in the middle of a transaction, as librdkafka (2.16) reports it from tansu:
    its ProduceRequest answered PRODUCER_FENCED (Apache Kafka answers INVALID_PRODUCER_EPOCH, which
    librdkafka makes fatal), or its TxnOffsetCommit (_FENCED), flagged abortable, not fatal; and
    every abort then times out (tansu drops the connection on a fenced EndTxn)."""

    def __init__(self, error: KafkaError) -> None:
        super().__init__()
        self.error = error

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls.append("send_offsets")
        raise KafkaException(self.error)

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        time.sleep(0.05)  # stands for the call's own timeout
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out waiting for operation to finish, retry "
                                        "call to resume", retriable=True))


@pytest.mark.parametrize("error", [
    KafkaError(KafkaError.PRODUCER_FENCED, "ProduceRequest for events.processed [5] with 1 message(s) failed: Broker: "
               "There is a newer producer with the same transactionalId which fences the current one: current "
               "transaction must be aborted", txn_requires_abort=True),
    KafkaError(KafkaError._FENCED, "Failed to commit offsets to transaction on broker 127.0.0.1:9092/111: "
               "events((null))[5](Broker: There is a newer producer with the same transactionalId which fences "
               "the current one) (after 0ms)", txn_requires_abort=True),
], ids=["produce-PRODUCER_FENCED", "offsets-_FENCED"])
def test_a_producer_fenced_mid_transaction_is_fenced_even_when_the_error_is_only_abortable(
        monkeypatch: Any, error: KafkaError) -> None:
    """Fenced is fenced, whatever librdkafka's flags: the broker holds a newer epoch of the slot's
    transactional id, so neither a commit nor an abort of this producer can succeed. Taken for a
    transient failure, the abort was retried until the commit deadline and the producer counted as
    given up (the fenced-in-place test's rare failure on tansu)."""
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_SECONDS", 1.5)
    producer = FencedMidTransactionProducer(error)
    thread, outcome = commit_in_thread(open_slot(5, producer))
    thread.join(20)
    assert not thread.is_alive(), f"still retrying after 20 s: {producer.calls[-5:]}"
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed), outcome
    assert not outcome[0].gave_up, outcome[0]
    assert "slot 5 was acquired by another worker" in str(outcome[0])
    assert "abort" not in producer.calls  # nothing to abort: the broker resolves what the fenced producer left open


class BlockingProducer(RecordingProducer):
    """A producer whose call blocks past its timeout until `released`."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def block(self, call: str) -> None:
        self.calls.append(call)
        self.released.wait()  # blocked in C: nothing in the process can interrupt it


class NeverReturningOffsetsProducer(BlockingProducer):
    """librdkafka (2.16) leaves send_offsets_to_transaction blocked past its own timeout, for good,
    when the group coordinator's broker died and left the metadata (librdkafka issues 5456, 5511)."""

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.block("send_offsets")


async def test_a_send_offsets_that_never_returns_gives_its_producer_up(monkeypatch: Any) -> None:
    monkeypatch.setattr(transactions, "OFFSETS_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(transactions, "CALL_STUCK_SECONDS", 0.3)
    producer = NeverReturningOffsetsProducer()
    output = await opened_slot(5, producer)
    try:
        thread, outcome = commit_in_thread(output)
        thread.join(10)
        assert not thread.is_alive(), f"the commit waits for a call that never returns: {producer.calls[-5:]}"
        assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed), outcome
        assert "did not return within 0.5 s" in str(outcome[0]) and outcome[0].gave_up
        calls = len(producer.calls)
        await output.close()  # the stuck producer is left alone: a flush could block behind the call
        assert len(producer.calls) == calls
    finally:
        producer.released.set()


def test_a_transaction_s_calls_never_wait_past_its_deadline() -> None:
    clock, give_up = FakeClock(), threading.Event()
    retry = transactions.CommitRetry("slot 1", give_up, threading.Event(), clock)
    deadline = transactions.COMMIT_DEADLINE_SECONDS
    assert retry.timeout(30.0, "flushing") == 30.0
    clock.now += deadline - 12.0
    assert retry.timeout(30.0, "flushing") == 12.0  # cut to what is left
    assert retry.timeout(10.0, "sending its offsets") == 10.0
    clock.now += 12.0
    with pytest.raises(TransactionFailed, match="no commit within") as late:
        retry.timeout(10.0, "committing")
    assert late.value.gave_up
    with pytest.raises(TransactionFailed, match="still failing after 1 tries") as failed:
        retry.failed("outputs not acknowledged within 12 s")  # no wait after the deadline
    assert failed.value.gave_up


def test_a_producer_given_up_starts_no_other_call_but_a_stopping_worker_still_commits() -> None:
    stopping, abandoned = threading.Event(), threading.Event()
    retry = transactions.CommitRetry("slot 1", stopping, abandoned, FakeClock())
    stopping.set()  # SIGTERM: no more retries, but the release's last commit goes through
    assert retry.timeout(30.0, "committing") == 30.0
    abandoned.set()
    with pytest.raises(TransactionFailed, match="gave this producer up") as raised:
        retry.timeout(30.0, "committing")
    assert raised.value.gave_up


def test_the_last_commit_of_a_stopping_worker_goes_through() -> None:
    producer = RecordingProducer()
    output = open_slot(2, producer)
    output.stop_retrying()
    commit(output, [OutputRecord("events.processed", 2, b"1", b"{}")], [TopicPartition("events", 2, 10)])
    assert producer.calls[-1] == "commit"


class StalledOutputsProducer(RecordingProducer):
    """What a slot producer did after its only broker restarted under load (librdkafka 2.16,
    2026-11-25): no usable connection ("No brokers available for Transactions") for minutes
    after the broker was back, each flush waiting its whole timeout with the outputs unacknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.flush_timeouts: list[float] = []

    def flush(self, timeout: float) -> int:
        self.flush_timeouts.append(timeout)
        time.sleep(timeout)
        return 3


def test_a_slot_whose_outputs_stay_unacknowledged_gives_its_producer_up_at_the_deadline(monkeypatch: Any) -> None:
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_SECONDS", 1.0)
    producer = StalledOutputsProducer()
    began = time.monotonic()
    thread, outcome = commit_in_thread(open_slot(5, producer))
    thread.join(10)
    assert not thread.is_alive(), f"still flushing after 10 s: {producer.flush_timeouts}"
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed) and outcome[0].gave_up, outcome
    # Each flush waits at most what is left of the deadline, not the client timeout (30 s).
    assert sum(producer.flush_timeouts) <= 1.0 and time.monotonic() - began < 5
    assert "send_offsets" not in producer.calls and "commit" not in producer.calls


class HungFlushProducer(BlockingProducer):
    """A flush that ignores its timeout, then succeeds."""

    def flush(self, timeout: float) -> int:
        self.block("flush")
        return 0


async def test_a_commit_whose_call_ignores_its_timeout_gives_its_producer_up(monkeypatch: Any) -> None:
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_SECONDS", 0.3)
    monkeypatch.setattr(transactions, "CALL_STUCK_SECONDS", 0.2)
    producer = HungFlushProducer()
    others = set(threading.enumerate())
    output = await opened_slot(5, producer)
    try:
        with pytest.raises(TransactionFailed, match=r"did not end within 0\.5 s") as raised:
            await asyncio.wait_for(output.commit([OutputRecord("events.processed", 5, b"1", b"{}")],
                                                 [TopicPartition("events", 5, 10)]), 10)
        assert raised.value.gave_up
        # The release does not wait behind the hung call, nor touches the producer again.
        await asyncio.wait_for(output.close(), 1)
        producer.released.set()
        # The call returned: the slot's thread ends, starting nothing else.
        (thread,) = [t for t in set(threading.enumerate()) - others if t.name == "keyrange-slot-5"]
        thread.join(10)
        assert not thread.is_alive()
        assert producer.calls == ["begin", "produce events.processed", "flush"]
    finally:
        producer.released.set()


async def test_a_producer_whose_transaction_failed_is_closed_without_a_flush(monkeypatch: Any) -> None:
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_SECONDS", 0.2)
    producer = StalledOutputsProducer()
    output = await opened_slot(4, producer)
    with pytest.raises(TransactionFailed):
        await output.commit([OutputRecord("events.processed", 4, b"1", b"{}")], [TopicPartition("events", 4, 10)])
    flushes = len(producer.flush_timeouts)
    await output.close()  # with Kafka away, a flush would wait its whole 5 s for nothing
    assert len(producer.flush_timeouts) == flushes


def test_a_fenced_flush_reported_as_a_system_error_still_fails_the_slot_as_fenced() -> None:
    """confluent-kafka can raise SystemError from flush(), its fatal KafkaException as the cause,
    when librdkafka logs the fatal error during the call (seen on Kafka in the fenced-in-place
    test): the slot fails as fenced, it does not crash the worker."""

    class FencedDuringFlushProducer(RecordingProducer):
        def flush(self, timeout: float) -> int:
            try:
                raise KafkaException(KafkaError(KafkaError._FENCED, "ProduceRequest for events.processed [5] with 7 "
                                                "message(s) failed: Broker: Producer attempted an operation with an "
                                                "old epoch", fatal=True))
            except KafkaException as fenced:
                raise SystemError("<built-in function isinstance> returned a result with an exception set") from fenced

    thread, outcome = commit_in_thread(open_slot(5, FencedDuringFlushProducer()))
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], TransactionFailed) and not outcome[0].gave_up, outcome
    assert "slot 5 was acquired by another worker" in str(outcome[0])


def test_a_system_error_without_a_kafka_cause_is_not_taken_for_a_kafka_failure() -> None:
    class BrokenProducer(RecordingProducer):
        def flush(self, timeout: float) -> int:
            raise SystemError("something else")

    thread, outcome = commit_in_thread(open_slot(5, BrokenProducer()))
    thread.join(5)
    assert len(outcome) == 1 and type(outcome[0]) is SystemError, outcome


class LockCheckingProducer(RecordingProducer):
    """Records, for each call that ends a transaction, whether another holder could take `lock`."""

    def __init__(self, lock: Path) -> None:
        super().__init__()
        self.lock = lock

    def _held(self) -> str:
        with self.lock.open("a") as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return "locked"
            fcntl.flock(file, fcntl.LOCK_UN)
            return "unlocked"

    def init_transactions(self, timeout: float) -> None:
        self.calls.append(f"init {self._held()}")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append(f"commit {self._held()}")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append(f"abort {self._held()}")


def test_a_slot_ends_its_transactions_under_its_partition_s_lock(tmp_path: Path) -> None:
    """tansu workaround (kafkaquirks.transactions_end_one_at_a_time): hash-range slots of one
    partition write the same partitions, and on tansu two transactions of them ending at once can
    leave one counted open for good. Every call that ends one (init_transactions ends what a previous
    owner left open, commit, abort) holds the lock; producing does not."""
    lock = tmp_path / "p0.lock"
    producer = LockCheckingProducer(lock)
    output = SlotTransactions(SETTINGS, 0, group_metadata=None, make_producer=lambda _: producer,  # type: ignore[arg-type,return-value]
                              end_lock=lock)
    asyncio.run(output.open())
    output._commit([OutputRecord("events.processed", 0, b"1", b"{}")], [])
    assert producer.calls[-4:] == ["init locked", "begin", "produce events.processed", "commit locked"]


class HeldProducer(RecordingProducer):
    """Records the offsets each send_offsets carries; the first `hold` call waits for `proceed`
    (the broker's answer), so that something can join the transaction meanwhile."""

    def __init__(self, hold: str, fail_commit: KafkaError | None = None) -> None:
        super().__init__()
        self.hold = hold
        self.fail_commit = fail_commit
        self.reached = threading.Event()
        self.proceed = threading.Event()
        self.offsets: list[list[tuple[int, int]]] = []

    def _held(self, call: str) -> None:
        if call == self.hold and not self.reached.is_set():
            self.reached.set()
            assert self.proceed.wait(10)

    def begin_transaction(self) -> None:
        super().begin_transaction()
        self._held("begin")

    def flush(self, timeout: float) -> int:
        self._held("flush")
        return super().flush(timeout)

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        super().send_offsets_to_transaction(offsets, metadata, timeout)
        self.offsets.append([(tp.partition, tp.offset) for tp in offsets])

    def commit_transaction(self, timeout: float) -> None:
        self._held("commit")
        if self.fail_commit is not None:
            raise KafkaException(self.fail_commit)
        super().commit_transaction(timeout)


def processed_record(key: bytes) -> OutputRecord:
    return OutputRecord("events.processed", 0, key, b"{}")


async def joined_while_held(producer: HeldProducer) -> tuple[SlotTransactions, bool, BaseException | None]:
    """A transaction of record 1 (offset 10) in flight, held at `producer.hold`, joined meanwhile
    by record 2 (offset 12): (the slot, whether it joined, what the commit raised)."""
    output = await opened_slot(0, producer)
    committing = asyncio.create_task(output.commit([processed_record(b"1")], [TopicPartition("events", 0, 10)]))
    assert await asyncio.to_thread(producer.reached.wait, 10)
    joined = output.join([processed_record(b"2")], [TopicPartition("events", 0, 12)])
    producer.proceed.set()
    try:
        await committing
    except TransactionFailed as exc:
        return output, joined, exc
    return output, joined, None


def test_what_joins_a_transaction_in_flight_commits_with_it_in_one_commit() -> None:
    """A release's batch joins the slot's transaction in flight instead of waiting for it to end and
    then running one of its own: one commit (a few broker round trips fewer in the handoff's pause).
    Joined while the transaction's outputs were being acknowledged: its records and newer offsets
    follow the transaction's own, each set of offsets only after the outputs before it."""
    producer = HeldProducer("flush")
    output, joined, failed = asyncio.run(joined_while_held(producer))
    assert joined and failed is None
    assert producer.calls == ["begin", "produce events.processed", "flush", "send_offsets",
                              "produce events.processed", "flush", "send_offsets", "commit"]
    assert producer.offsets == [[(0, 10)], [(0, 12)]]
    assert not output.join([processed_record(b"3")], [])  # it ended: nothing joins it any more


def test_what_joins_before_the_transaction_s_position_is_written_goes_out_with_it() -> None:
    producer = HeldProducer("begin")
    _, joined, failed = asyncio.run(joined_while_held(producer))
    assert joined and failed is None
    assert producer.calls == ["begin", "produce events.processed", "produce events.processed", "flush",
                              "send_offsets", "commit"]
    assert producer.offsets == [[(0, 12)]]  # the newer offset only


def test_nothing_joins_a_transaction_that_started_to_end() -> None:
    """Its commit is on the wire: what would join it could not be in it, so the caller commits it in
    a transaction of its own after this one."""
    producer = HeldProducer("commit")
    output, joined, failed = asyncio.run(joined_while_held(producer))
    assert not joined and failed is None
    assert producer.calls == ["begin", "produce events.processed", "flush", "send_offsets", "commit"]
    assert producer.offsets == [[(0, 10)]]
    assert not output.join([processed_record(b"3")], [])


def test_what_joined_a_transaction_that_is_fenced_fails_with_it() -> None:
    producer = HeldProducer("commit", fail_commit=KafkaError(KafkaError._FENCED, "Producer fenced by newer instance",
                                                             fatal=True))
    producer.hold = "flush"  # joins before the end, which then fails
    output, joined, failed = asyncio.run(joined_while_held(producer))
    assert joined and isinstance(failed, TransactionFailed) and not failed.gave_up
    assert "commit" not in producer.calls
    assert not output.join([processed_record(b"3")], [])  # a failed transaction takes nothing more


class JoinedRecordRefusedOnce(HeldProducer):
    """The first produce of the joined record (key 2) fails as an abortable error would (the
    transaction is aborted and the same batch tried again); the keys of every produce are kept."""

    def __init__(self) -> None:
        super().__init__("flush")
        self.keys: list[bytes] = []
        self.refused = False

    def produce(self, topic: str, **kwargs: Any) -> None:
        if kwargs["key"] == b"2" and not self.refused:
            self.refused = True
            raise KafkaException(KafkaError(KafkaError._STATE, "transaction must be aborted", txn_requires_abort=True))
        super().produce(topic, **kwargs)
        self.keys.append(kwargs["key"])

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        self.keys.clear()


def test_what_joined_is_written_again_when_the_transaction_is_tried_again() -> None:
    """A retried transaction writes the whole batch again: what joined it too, even when producing
    the joined records is what failed (else the commit would count a batch it never carried)."""
    producer = JoinedRecordRefusedOnce()
    _, joined, failed = asyncio.run(joined_while_held(producer))
    assert joined and failed is None
    assert "abort" in producer.calls and producer.calls[-1] == "commit"
    assert producer.keys == [b"1", b"2"]
    assert producer.offsets[-1] == [(0, 12)]
