"""Fencing by the broker: a stale writer's outputs and offset commits are rejected by Kafka itself.

A slot's transactional id is derived from the group and the slot, so whoever acquires the slot
fences every earlier owner; the controller's control records go through one transactional id per
group, so a second controller fences the first. The epoch protocol alone could not stop a worker
that was paused (GC, a frozen VM, SIGSTOP) through a handoff from committing when it wakes up.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.errors import UserError
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.local.ports import free_port
from keyrange.ranges.channel import ControlChannel, Publication, now_ms
from keyrange.ranges.controller import Controller, ControllerFenced
from keyrange.ranges.planner import ScalingLimits
from keyrange.ranges.rangemap import RangeMap
from keyrange.worker import transactions
from keyrange.worker.transactions import OutputRecord, SlotTransactions, TransactionFailed
from tests.checkers import check_all, first_occurrences
from tests.conftest import BrokerUnderTest
from tests.integration.supervised import stop_outside_transaction_ends, transaction_end_locks
from tests.integration.worker_cli_helpers import PARTITIONS, metric_sum, start, wait, worker_command
from tests.integration.worker_helpers import produce_stream, settings_for
from tests.kafkatools import offsets_committed_so_far, read_counts, read_input_log, read_processed


def committed(bootstrap: str, topic: str) -> dict[int, int]:
    # Not waiting for the frozen zombie's open transaction, which may hold offsets of the group.
    return offsets_committed_so_far(bootstrap, topic, f"{topic}-g", range(PARTITIONS))


@pytest.mark.slow
def test_a_zombie_worker_that_wakes_up_after_its_replacement_took_over_commits_nothing(
        any_bootstrap: str, topic_name: str, tmp_path: Path) -> None:
    bootstrap = any_bootstrap
    sent = produce_stream(bootstrap, topic_name, 3000, PARTITIONS, clients=120, duplicate_ratio=0.03, ledger=True)
    log = read_input_log(bootstrap, topic_name, sent)
    distinct = len(first_occurrences(log))
    zombie_port, zombie_log = free_port(), tmp_path / "zombie.log"
    # A slow handler, so the zombie is frozen with events in flight and outputs staged.
    slow = ("--handler-config", '{"delayMs": 20}', "--concurrency", "4")
    zombie = start([*worker_command(bootstrap, topic_name, zombie_port, *slow), "--worker-id", "zombie"], zombie_log)
    replacement = None
    try:
        wait(lambda: metric_sum(zombie_port, "keyrange_events_processed_total") >= 300, "the first worker to run",
             proc=zombie, log_path=zombie_log)
        # Stopped outside a transaction end: stopped inside one, it would keep that partition's
        # host-wide lock and hold up each of the replacement's commits there for 30 s.
        stop_outside_transaction_ends(zombie.pid, transaction_end_locks(bootstrap, f"{topic_name}.processed",
                                                                        PARTITIONS))
        frozen_at = committed(bootstrap, topic_name)
        # Its replacement (another worker id: the epoch protocol did not stop the zombie) takes the
        # same slots and handles everything.
        port, log_path = free_port(), tmp_path / "replacement.log"
        replacement = start([*worker_command(bootstrap, topic_name, port), "--worker-id", "replacement"], log_path)
        ends = {p: max([e.offset + 1 for e in log if e.partition == p], default=0) for p in range(PARTITIONS)}
        wait(lambda: all(o >= ends[p] for p, o in committed(bootstrap, topic_name).items()),
             "the replacement to commit everything", proc=replacement, log_path=log_path)
        done = committed(bootstrap, topic_name)
        zombie.send_signal(signal.SIGCONT)
        # The zombie's next commit is rejected by the broker: it stops instead of writing.
        assert zombie.wait(60) != 0, zombie_log.read_text()[-3000:]
    finally:
        for proc in (zombie, replacement):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                proc.wait(60)
    text = zombie_log.read_text()
    assert "was acquired by another worker (its transactional id fenced this one)" in text, text[-3000:]
    assert committed(bootstrap, topic_name) == done  # its offset commits were rejected too
    assert all(done[p] >= frozen_at[p] for p in done)
    # read_committed readers never see what the zombie wrote after it was fenced: every event is
    # handled once, the ledger equals the oracle, the totals add up.
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct)
    check_all(log, processed, read_counts(bootstrap, topic_name, f"{topic_name}-g", covering=sent), ledger=True)


def test_a_second_controller_fences_the_first(any_bootstrap: str, topic_name: str) -> None:
    bootstrap = any_bootstrap
    ControlChannel.ensure_topic(bootstrap, topic_name)
    limits = ScalingLimits(max_workers=4, cooldown_seconds=0)
    first = Controller(ControlChannel(bootstrap, topic_name, "c1"), 12, limits, _NoLag())
    second = Controller(ControlChannel(bootstrap, topic_name, "c2"), 12, limits, _NoLag())
    reader = ControlChannel(bootstrap, topic_name, "reader")
    try:
        assert first.start().epoch == 1
        assert second.start().epoch == 1  # took over: the first is fenced from now on
        stale = Publication(RangeMap.even(12, 3, epoch=2), reason="stale controller", published_ms=now_ms())
        with pytest.raises(ControllerFenced, match="another controller"):
            first.channel.publish(stale)
        assert isinstance(ControllerFenced("x"), UserError)
        reader.catch_up()
        assert reader.state.publication is not None
        assert reader.state.publication.reason != "stale controller"
        assert reader.state.publication.epoch == 1
    finally:
        for channel in (first.channel, second.channel, reader):
            channel.close()


class _NoLag:
    def slot_lag(self) -> dict[int, object]:
        return {}


class FencedBefore:
    """A slot's real producer, fenced by another producer of its transactional id once `armed`,
    right before its next `call` (one of the transactional calls)."""

    def __init__(self, producer: Producer, fencer: Producer, call: str) -> None:
        self._producer = producer
        self._fencer = fencer
        self._call = call
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._producer, name)
        if name != self._call:
            return method

        def fenced_first(*args: Any) -> Any:
            if self.armed:
                self.armed = False
                self._fencer.init_transactions(30)
            return method(*args)

        return fenced_first


@pytest.mark.parametrize("call", ["send_offsets_to_transaction", "commit_transaction"])
async def test_a_slot_producer_fenced_in_the_middle_of_a_transaction_fails_as_fenced(
        broker_engine: BrokerUnderTest, topic_name: str, call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fenced after its outputs were acknowledged, right before its offsets or its commit. Apache
    Kafka answers fenced (fatal _FENCED) at both. tansu accepts a fenced AddOffsetsToTxn, then fails
    its TxnOffsetCommit with an error librdkafka flags only abortable: the slot must still fail as
    fenced, not retry an abort until the commit deadline and count the producer as given up (see
    `kafkaquirks.classify`). Either way the fenced transaction's offsets never commit.

    tansu workaround: tansu drops the connection on a fenced EndTxn, so there a fence right before
    the commit cannot be told from Kafka being away: the commit is retried until its deadline and
    the producer given up; the slot is then acquired again all the same (without committing)."""
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_SECONDS", 8.0)
    bootstrap = broker_engine.bootstrap
    s = settings_for(bootstrap, topic_name)
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1), TopicSpec(s.sink, 1)], s.kafka_timeout_seconds)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": s.group_id, "log_level": 3})
    fencer = Producer({"bootstrap.servers": bootstrap, "transactional.id": s.slot_transactional_id(0),
                       "log_level": 0})
    made: list[FencedBefore] = []

    def make_producer(config: dict[str, Any]) -> Producer:
        made.append(FencedBefore(Producer(config), fencer, call))
        return made[0]  # type: ignore[return-value]

    output = SlotTransactions(s, 0, consumer.consumer_group_metadata(), make_producer=make_producer)
    try:
        await output.open()
        record = OutputRecord(s.sink, 0, b"1", b"{}")
        await output.commit([record], [TopicPartition(topic_name, 0, 10)])
        made[0].armed = True
        with pytest.raises(TransactionFailed) as failed:
            await output.commit([record], [TopicPartition(topic_name, 0, 20)])
        if broker_engine.engine == "tansu" and call == "commit_transaction":
            assert failed.value.gave_up and "committing failed" in str(failed.value), failed.value
        else:
            assert not failed.value.gave_up, failed.value
            assert "slot 0 was acquired by another worker" in str(failed.value), failed.value
        [offset] = consumer.committed([TopicPartition(topic_name, 0)], timeout=10)
        assert offset.offset == 10  # the fenced transaction's offsets did not commit
    finally:
        await output.close()
        consumer.close()
