"""Restore is right whatever prefix of a crashed worker's transaction became visible.

tansu's init_transactions commits the open transaction of a killed predecessor instead of
aborting it, so the sink partition can hold a prefix of that transaction's processed records and
the changelog an independent prefix of its state records. These tests write such torn states
directly on the topics (non-transactionally, as the engine would have laid them out), then check
`restore()` and a real Worker continuing from them against the sequential ledger oracle.

They run on tansu only, on purpose: the torn states they lay out are tansu's bug. On Apache
Kafka a transaction is atomic, and the next owner of a slot, initialising the slot's
transactional id, aborts whatever its dead predecessor left open; Kafka never shows such a
prefix. That restore's handling of them does no harm on Kafka is shown by every guarantee test
that runs on both brokers (each acquire restores).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.events import (
    GROUP_HEADER,
    SOURCE_OFFSET_HEADER,
    STATE_HEADER,
    TOTALS_KEY,
    encode_processed,
    parse_input,
)
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker import WorkerSettings
from keyrange.worker.restore import restore
from tests.checkers import LoggedEvent, check_ledger, check_no_duplicates, check_no_loss, ledger_oracle
from tests.integration.worker_helpers import produce_stream, run_worker_until, settings_for
from tests.kafkatools import committed_offsets, read_topic

EVENTS = 400
CRASHED = "crashed-worker"


@dataclass
class Txn:
    """One engine transaction as it would have been written: events in finish order."""

    offsets: list[int]
    sink_visible: int | None = None
    """How many processed records reached the sink (None: all)."""
    changelog_visible: int | None = None
    """How many changelog records reached the state topic (None: all)."""
    commit: int | None = None
    """The offset committed with it (visible only after all its outputs), or None."""


class Scenario:
    """A one-partition ledger stream, its oracle, and writers for what a crashed worker left."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        produce_stream(bootstrap, topic, EVENTS, partitions=1, clients=25, duplicate_ratio=0.0,
                       ledger=True)
        self.settings: WorkerSettings = settings_for(bootstrap, topic)
        s = self.settings
        ensure_topics(bootstrap, [TopicSpec(s.sink, 1), TopicSpec(s.dlq, 1),
                                  TopicSpec(s.state, 1, {"cleanup.policy": "compact"}, exact_partitions=True)],
                      s.kafka_timeout_seconds)
        self.counts = {topic: 1, s.sink: 1, s.dlq: 1, s.state: 1}
        self.log = [LoggedEvent(m.partition(), m.offset(), orjson.loads(m.value())["clientId"],
                                orjson.loads(m.value())["uuid"], orjson.loads(m.value()))
                    for m in read_topic(bootstrap, topic, EVENTS)]
        assert [e.offset for e in self.log] == list(range(EVENTS))
        self.oracle = ledger_oracle(self.log)
        self.producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
        self.committed = 0
        self.visible: set[int] = set()
        """Offsets whose processed record is on the sink."""
        self.changelog_written = 0

    def state_after(self, offset: int) -> int:
        """The ledger counter of the event's client after it ran (every ledger event sets it)."""
        return self.oracle[self.log[offset].uuid]["value"]

    def write(self, txn: Txn) -> None:
        """Produce what of `txn` became visible, laid out as the engine writes it."""
        s = self.settings
        processed = txn.offsets[:txn.sink_visible]
        for offset in processed:
            e = self.log[offset]
            key, value = encode_processed(parse_input(orjson.dumps(e.body)), 0, offset, CRASHED, 0, 0,
                                          self.oracle[e.uuid])
            self.producer.produce(s.sink, value, key, partition=0,
                                  headers=[(GROUP_HEADER, s.group_id.encode()),
                                           (STATE_HEADER, orjson.dumps(self.state_after(offset)))])
            self.visible.add(offset)
        coalesced: dict[int, int] = {}  # clientId -> offset of its last state change, first-write order
        for offset in txn.offsets:
            coalesced[self.log[offset].client_id] = offset
        for client, offset in list(coalesced.items())[:txn.changelog_visible]:
            self.producer.produce(s.state, orjson.dumps(self.state_after(offset)), str(client).encode(),
                                  partition=0, headers=[(SOURCE_OFFSET_HEADER, str(offset).encode())])
            self.changelog_written += 1
        assert self.producer.flush(30) == 0
        if txn.commit is not None:
            assert txn.sink_visible is None and txn.changelog_visible is None, "offsets come after outputs"
            consumer = Consumer({"bootstrap.servers": s.bootstrap, "group.id": s.group_id, "log_level": 3})
            try:
                consumer.commit(offsets=[TopicPartition(s.topic, 0, txn.commit)], asynchronous=False)
            finally:
                consumer.close()
            self.committed = txn.commit

    def expected(self) -> tuple[set[int], dict[int, int]]:
        """Finished offsets >= the committed one, and each client's state after its last finished event."""
        finished = {o for o in self.visible if o >= self.committed}
        state: dict[int, int] = {}
        for e in self.log:
            if e.offset < self.committed or e.offset in finished:
                state[e.client_id] = self.state_after(e.offset)
        return finished, state

    async def check(self) -> None:
        """restore() matches the expectation, and a real worker continuing from it matches the oracle."""
        finished, state = self.expected()
        restored = restore(self.settings, {0: self.committed}, self.counts)[0]
        assert restored.start_offset == self.committed
        assert set(restored.finished_offsets) == finished
        wrong = {c: (v, state.get(c)) for c, v in restored.state.items() if state.get(c) != v}
        assert restored.state == state, f"restored state differs (client: (restored, expected)): {wrong}"

        remaining = EVENTS - self.committed - len(finished)
        await run_worker_until(self.settings, "ledger", [0], lambda w: w.stats.processed >= remaining)
        records = read_topic(self.settings.bootstrap, self.settings.sink)
        processed = [orjson.loads(m.value()) for m in records]
        check_no_duplicates(processed)
        check_no_loss(self.log, processed)
        check_ledger(self.log, processed)
        # What the real worker wrote has the headers restore relies on.
        ours = [m for m, r in zip(records, processed, strict=True) if r["worker"] != CRASHED]
        assert len(ours) == remaining
        assert all(orjson.loads(dict(m.headers())[STATE_HEADER]) == r["result"]["value"]
                   for m, r in zip(records, processed, strict=True) if r["worker"] != CRASHED)
        changelog = read_topic(self.settings.bootstrap, self.settings.state)[self.changelog_written:]
        assert changelog
        for m in changelog:
            if m.key() == TOTALS_KEY:
                continue  # the partition's totals (checked by the guarantee tests), not a client's state
            offset = int(dict(m.headers())[SOURCE_OFFSET_HEADER])
            assert orjson.loads(m.value()) == self.state_after(offset)
        # The next owner, from the offset the worker committed past every event, reads the state of
        # each client from the changelog alone: the torn transaction's too.
        final = committed_offsets(self.settings.bootstrap, self.settings.topic, self.settings.group_id)[0]
        assert final == EVENTS
        again = restore(self.settings, {0: final}, self.counts)[0]
        last = {e.client_id: self.state_after(e.offset) for e in self.log}
        lost = {c: (again.state.get(c), v) for c, v in last.items() if again.state.get(c) != v}
        assert not lost, f"restored from {final}, clients' states differ (client: (restored, expected)): {lost}"


def changelog_ahead_of_processed_records(s: Scenario) -> None:
    """State records a transaction wrote ahead of its processed records are ignored."""
    s.write(Txn(list(range(200)), commit=200))
    # The crashed worker's transaction: every state record landed, none of the processed ones.
    s.write(Txn(list(range(200, 260)), sink_visible=0))


def processed_records_without_changelog(s: Scenario) -> None:
    """Processed records whose state records never landed carry the state themselves."""
    s.write(Txn(list(range(200)), commit=200))
    # Every processed record landed, none of the state records.
    s.write(Txn(list(range(200, 260)), changelog_visible=0))


def processed_records_without_changelog_near_the_end(s: Scenario) -> None:
    """The states that processed records without changelog records carry outlive the next commit:
    most clients have no event after the torn transaction to write their state again."""
    s.write(Txn(list(range(200)), commit=200))
    s.write(Txn(list(range(200, 380)), changelog_visible=0))


def torn_after_offsets_committed_past_out_of_order_outputs(s: Scenario) -> None:
    """A torn transaction after one whose outputs reach past its committed offset."""
    s.write(Txn(list(range(150)), commit=150))
    # Events finish out of order: one client's event at 170 is still running, so the complete
    # transaction commits 170 while holding later events of other clients (their changelog
    # entries coalesce past 170).
    slow = s.log[170].client_id
    held_back = [o for o in range(170, 260) if s.log[o].client_id == slow]
    s.write(Txn([o for o in range(150, 260) if o not in held_back], commit=170))
    # The next transaction is torn: a prefix of its processed records, an independent (longer
    # for some clients) prefix of its state records, and no offsets.
    s.write(Txn(held_back + list(range(260, 330)), sink_visible=30, changelog_visible=18))
    assert s.committed == 170


@pytest.mark.parametrize("lay_out", [changelog_ahead_of_processed_records, processed_records_without_changelog,
                                     processed_records_without_changelog_near_the_end,
                                     torn_after_offsets_committed_past_out_of_order_outputs],
                         ids=lambda lay_out: lay_out.__name__)
async def test_restore_and_the_next_worker_are_right_after_a_torn_transaction(
        bootstrap: str, topic_name: str, lay_out: Callable[[Scenario], None]) -> None:
    s = Scenario(bootstrap, topic_name)
    lay_out(s)
    await s.check()
