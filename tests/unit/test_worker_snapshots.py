"""Changelog snapshots (worker/snapshots.py): when a slot writes one, which one its totals records
name, where a restore starts reading, and that reading from there restores what reading the whole
changelog does. No Kafka: a slot's transactions append to an in-memory log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from confluent_kafka import TopicPartition

from keyrange.events import SNAPSHOT_HEADER, SOURCE_OFFSET_HEADER, TOTALS_KEY, encode_totals
from keyrange.logend import Span
from keyrange.worker import snapshots
from keyrange.worker.committer import Committer
from keyrange.worker.commitwindow import Outcome
from keyrange.worker.restore import OutputEntry, ParsedLogs, RestoredPartition, fold_logs
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.slot import SlotState
from keyrange.worker.snapshots import SnapshotSchedule, changelog_starts
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord
from tests.fake_message import FakeMessage
from tests.slotstate import held_slot

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0")
STATE = (SETTINGS.state, 0)


class ChangelogTransactions:
    """A slot's transactions that append its changelog records to one in-memory log, with an offset
    for each commit marker as Kafka writes it, and tell each delivery."""

    def __init__(self) -> None:
        self.log: list[FakeMessage] = []
        self.end = 0

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        for r in records:
            if r.topic != SETTINGS.state:
                continue
            record = FakeMessage(self.end, r.key, r.value, r.headers)
            self.log.append(record)
            self.end += 1
            if r.delivered is not None:
                r.delivered(None, record)  # type: ignore[arg-type]
        self.end += 1  # the commit marker


class LogOnlyReader:
    """Reads an in-memory changelog as LogReader does; counts the records it hands back."""

    def __init__(self, log: list[FakeMessage], first: int = 0, listed_first: int | None = None) -> None:
        self.log = [r for r in log if r.offset() >= first]
        self.first = first
        self.listed_first = first if listed_first is None else listed_first
        """The first offset ListOffsets lists (tansu's can be past records the log holds)."""
        self.end = log[-1].offset() + 2 if log else first
        self.records_read = 0

    def bounds(self, spans: list[Span]) -> dict[Span, tuple[int, int]]:
        return {span: (self.listed_first, self.end) for span in spans}

    def read(self, starts: dict[Span, int], stops: dict[Span, int] | None = None,
             each: Callable[[Span, list[FakeMessage]], None] | None = None
             ) -> tuple[dict[Span, list[FakeMessage]], dict[Span, int]]:
        stops = stops or {}
        out: dict[Span, list[FakeMessage]] = {span: [] for span in starts}
        ends = {}
        for span, start in starts.items():
            stop = stops.get(span, self.end)
            batch = [r for r in self.log if start <= r.offset() < stop]
            self.records_read += len(batch)
            if batch and each is not None:
                each(span, batch)
            elif each is None:
                out[span] = batch
            ends[span] = stop
        return out, ends


def totals_record(offset: int, counted_to: int, snapshot_start: int | None) -> FakeMessage:
    headers = [(SOURCE_OFFSET_HEADER, str(counted_to).encode())]
    if snapshot_start is not None:
        headers.append((SNAPSHOT_HEADER, str(snapshot_start).encode()))
    return FakeMessage(offset, TOTALS_KEY, encode_totals(counted_to, 0, 0), headers)


def test_a_snapshot_is_due_after_a_multiple_of_the_live_clients_plus_a_floor() -> None:
    schedule = SnapshotSchedule(None, 0)
    threshold = snapshots.SNAPSHOT_EVERY * (3 + snapshots.SNAPSHOT_FLOOR)
    schedule.committed(threshold - 1, None, False, None)
    assert not schedule.due(3)
    schedule.committed(1, None, False, None)
    assert schedule.due(3)
    assert not schedule.due(4)


def test_a_snapshot_is_named_once_its_transaction_committed_until_a_newer_one() -> None:
    schedule = SnapshotSchedule(100, 5000)
    schedule.committed(31, 7000, True, 100)  # its own totals record still names the one before
    assert (schedule.start, schedule.named, schedule.since) == (7000, False, 31)
    schedule.committed(1, None, False, 7000)
    assert schedule.named
    # A snapshot whose delivery report said nothing is not named; the next is due as late anyway.
    schedule.committed(40, None, True, 7000)
    assert (schedule.start, schedule.named, schedule.since) == (7000, True, 40)


def test_the_search_reads_back_only_to_the_newest_totals_record_the_committed_offset_covers() -> None:
    log = [FakeMessage(o, b"7", b"1", [(SOURCE_OFFSET_HEADER, str(o).encode())]) for o in range(100_000)]
    log += [totals_record(100_000, 500, 90_000), totals_record(100_001, 520, 95_000),
            totals_record(100_002, 530, 99_000)]  # the last counts past C = 520: its offsets did not commit
    reader = LogOnlyReader(log)
    assert changelog_starts(reader, SETTINGS.state, {0: 520}) == {STATE: 95_000}  # type: ignore[arg-type]
    assert reader.records_read <= snapshots.SEARCH_FIRST_RECORDS


def test_the_search_steps_back_in_doubling_steps_past_a_long_stretch_without_totals_records() -> None:
    log = [totals_record(0, 10, 0)] + [FakeMessage(o, b"7", b"1", None) for o in range(1, 50_000)]
    reader = LogOnlyReader(log)
    assert changelog_starts(reader, SETTINGS.state, {0: 10}) == {STATE: 0}  # type: ignore[arg-type]
    assert reader.records_read <= 2 * len(log)


def test_without_a_named_snapshot_the_changelog_is_read_from_its_start() -> None:
    """From offset 0, where a read begins at the log's start (300 here: its head was deleted)."""
    log = [FakeMessage(o, b"7", b"1", None) for o in range(300, 400)] + [totals_record(400, 10, None)]
    reader = LogOnlyReader(log, first=300)
    start = changelog_starts(reader, SETTINGS.state, {0: 10})  # type: ignore[arg-type]
    assert start == {STATE: 0}
    assert [m.offset() for m in reader.read(start)[0][STATE]] == list(range(300, 401))
    assert changelog_starts(LogOnlyReader([]), SETTINGS.state, {0: 0}) == {STATE: 0}  # type: ignore[arg-type]


def test_a_listed_start_past_the_first_records_does_not_skip_them() -> None:
    """tansu can list a fresh partition's earliest offset past its first batches when several
    producers wrote them at once (docs/kafka.md): a restore that began there lost a client's only
    changelog record, and the client's state with it."""
    log = [FakeMessage(o, str(o).encode(), b"1", None) for o in range(40)] + [totals_record(40, 10, None)]
    reader = LogOnlyReader(log, listed_first=24)
    start = changelog_starts(reader, SETTINGS.state, {0: 10})  # type: ignore[arg-type]
    assert [m.offset() for m in reader.read(start)[0][STATE]][:24] == list(range(24))


CLIENTS = 30
EVENTS = 3000
SLOW_AT = 2600
"""The event that is still running at the end: the committed offset stays there, later events finish."""


def run_slot(transactions: ChangelogTransactions) -> tuple[SlotState, list[OutputEntry]]:
    """A slot handles EVENTS events of CLIENTS counters (every 9th deletes its client's state),
    committing every 7 events; the event at SLOW_AT and its client's later ones never finish."""
    slot = held_slot(0, transactions)
    committer = Committer(SETTINGS, lambda: [slot], WorkerStats())
    counters: dict[int, int] = {}
    after_committed: list[OutputEntry] = []
    slow = SLOW_AT % CLIENTS

    async def scenario() -> None:
        for offset in range(EVENTS):
            assert slot.admit(offset, 0, 0)
            client = offset % CLIENTS
            if offset >= SLOW_AT and client == slow:
                continue
            if offset % 9 == 0:
                counters.pop(client, None)
                state = None
            else:
                counters[client] = state = counters.get(client, 0) + 1
            processed = OutputRecord(SETTINGS.sink, 0, b"", b"")  # not in the changelog
            slot.finish_processed(offset, processed, client, None if state is None else str(state).encode(),
                                state is None)
            if offset >= SLOW_AT:  # finished past the committed offset: its processed record carries the state
                after_committed.append(OutputEntry(0, offset, f"u{offset}", 0.0, (client, state), Outcome.HANDLED))
            if offset % 7 == 0:
                await committer.commit_now()
        await committer.commit_now()

    asyncio.run(scenario())
    assert slot.committed_offset == SLOW_AT
    return slot, after_committed


def restored_from(log: list[FakeMessage], first: int, outputs: list[OutputEntry]) -> RestoredPartition:
    parsed = ParsedLogs()
    parsed.add(SETTINGS, STATE, [r for r in log if r.offset() >= first])  # type: ignore[misc]
    parsed.outputs = outputs
    return fold_logs({0: SLOW_AT}, parsed)[0]


def test_a_restore_from_the_named_snapshot_restores_what_the_whole_changelog_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "SNAPSHOT_FLOOR", 10)
    transactions = ChangelogTransactions()
    slot, outputs = run_slot(transactions)
    log = transactions.log
    start = changelog_starts(LogOnlyReader(log), SETTINGS.state, {0: SLOW_AT})[STATE]  # type: ignore[arg-type]
    assert start > 0, "no snapshot was named"
    bound = snapshots.SNAPSHOT_EVERY * (CLIENTS + 10) + 2 * (CLIENTS + 1)
    assert len([r for r in log if r.offset() >= start]) <= bound < len(log) // 5

    whole, from_snapshot = restored_from(log, 0, outputs), restored_from(log, start, outputs)
    assert from_snapshot.state == whole.state == {c: int(v) for c, v in slot.states.items()}
    assert from_snapshot.totals == whole.totals == slot.committed_totals
    assert from_snapshot.totals.handled == SLOW_AT
    # The next owner names the same snapshot, and counts the records since it towards the next.
    assert from_snapshot.snapshot_start == slot.snapshot_start
    assert from_snapshot.state_offsets == slot.state_offsets
