"""The controller's transactional writer on the control topic: what a failed write means (no Kafka:
a fake producer stands in for confluent's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyrange.ranges.channel import ControlChannel, ControllerFenced, ControlWriteFailed, Publication
from keyrange.ranges.rangemap import RangeMap
from tests.kafka_failures import system_error_from


class FailingWriter:
    """Stands in for confluent's Producer: its next commit raises `failure` (once), and it records calls."""

    def __init__(self) -> None:
        self.failure: BaseException | None = None
        self.abort_failure: BaseException | None = None
        self.flush_failure: BaseException | None = None
        self.calls: list[str] = []

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, value: bytes, key: bytes) -> None:
        self.calls.append("produce")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        failure, self.abort_failure = self.abort_failure, None
        if failure is not None:
            raise failure

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        failure, self.flush_failure = self.flush_failure, None
        if failure is not None:
            raise failure
        return 0

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture
def writer_channel() -> Iterator[tuple[ControlChannel, FailingWriter]]:
    """A controller's channel whose every producer is a FailingWriter (nothing reaches a broker)."""
    writer = FailingWriter()
    channel = ControlChannel("127.0.0.1:1", "g", make_producer=lambda _config: writer)  # type: ignore[arg-type,return-value]
    channel.claim_writer()
    yield channel, writer
    channel.close()


def publication() -> Publication:
    return Publication(RangeMap.even(12, 1))


@pytest.mark.parametrize(("commit_failure", "abort_failure"), [
    # confluent-kafka's wrapping of a fenced commit (the controller retried it forever as a bug)
    (system_error_from(KafkaError(KafkaError._FENCED, "fenced", fatal=True)), None),
    # tansu's fenced answer, flagged only abortable
    (KafkaException(KafkaError(KafkaError.PRODUCER_FENCED, "fenced", txn_requires_abort=True)), None),
    # fenced while the abort of an abortable failure ran (it escaped as a raw KafkaException)
    (KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out", txn_requires_abort=True)),
     system_error_from(KafkaError(KafkaError._FENCED, "fenced", fatal=True))),
], ids=["system-error", "abortable-code", "fenced-abort"])
def test_a_fenced_writer_says_another_controller_took_over(
        writer_channel: tuple[ControlChannel, FailingWriter], commit_failure: BaseException,
        abort_failure: BaseException | None) -> None:
    channel, writer = writer_channel
    writer.failure, writer.abort_failure = commit_failure, abort_failure
    with pytest.raises(ControllerFenced, match="another controller"):
        channel.publish(publication())


@pytest.mark.parametrize("failure", [
    system_error_from(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out", txn_requires_abort=True)),
    # Abortable, not fatal: the broker aborted this producer's own transaction after its timeout
    # (KIP-588), which an abort and the next write get over; not another controller taking over.
    KafkaException(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "epoch", txn_requires_abort=True)),
], ids=["system-error", "epoch-aborted"])
def test_an_abortable_failure_is_aborted_and_the_next_write_goes_through(
        writer_channel: tuple[ControlChannel, FailingWriter], failure: BaseException) -> None:
    channel, writer = writer_channel
    writer.failure = failure
    with pytest.raises(ControlWriteFailed):
        channel.publish(publication())
    assert writer.calls[-1] == "abort"
    writer.calls.clear()
    channel.publish(publication())
    assert writer.calls == ["begin", "produce", "commit"]


def test_a_commit_that_timed_out_is_finished_before_the_next_write(
        writer_channel: tuple[ControlChannel, FailingWriter]) -> None:
    channel, writer = writer_channel
    writer.failure = KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))
    with pytest.raises(ControlWriteFailed):
        channel.publish(publication())
    writer.calls.clear()
    channel.publish(publication())
    assert writer.calls == ["commit", "begin", "produce", "commit"]


def test_a_system_error_without_a_kafka_cause_is_not_taken_for_a_kafka_failure(
        writer_channel: tuple[ControlChannel, FailingWriter]) -> None:
    channel, writer = writer_channel
    writer.failure = SystemError("a bug")
    with pytest.raises(SystemError, match="a bug"):
        channel.publish(publication())


def test_claiming_the_writer_reports_a_kafka_failure_wrapped_in_a_system_error_as_a_kafka_failure() -> None:
    """The operator retries a controller whose claim failed on Kafka (KafkaException); a SystemError
    escaped that and ended the controller's thread."""
    writer = FailingWriter()
    channel = ControlChannel("127.0.0.1:1", "g", make_producer=lambda _config: writer)  # type: ignore[arg-type,return-value]

    def init_fails(timeout: float) -> None:
        raise system_error_from(KafkaError(KafkaError._TIMED_OUT, "no coordinator", retriable=True))

    writer.init_transactions = init_fails  # type: ignore[method-assign]
    try:
        with pytest.raises(KafkaException, match="no coordinator"):
            channel.claim_writer(0.1)
    finally:
        channel.close()


def test_a_fenced_controller_closes_its_channel_without_raising() -> None:
    # The fenced error of a write's add-partitions request can be raised by the next call that serves
    # the producer's events: under load that was close()'s flush (test_fencing, a clean-clone run).
    made: list[FailingWriter] = []

    def make(_config: object) -> FailingWriter:
        made.append(FailingWriter())
        return made[-1]

    channel = ControlChannel("127.0.0.1:1", "g", make_producer=make)  # type: ignore[arg-type]
    channel.claim_writer()
    reports, writer = made
    writer.failure = system_error_from(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    with pytest.raises(ControllerFenced):
        channel.publish(publication())
    writer.flush_failure = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    channel.close()
    assert reports.calls[-2:] == ["flush", "close"] and writer.calls[-1] == "flush", (reports.calls, writer.calls)
