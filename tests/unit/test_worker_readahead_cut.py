"""A grant that comes while the new owner still reads ahead: the acquire does not wait for the
read-ahead to end (worker/readahead.py), it cuts it short and goes on from where it got."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any
from unittest.mock import patch

from confluent_kafka import TopicPartition

from keyrange.worker.dedup import TtlSet
from keyrange.worker.logreader import LogReader
from keyrange.worker.readahead import ReadAhead
from keyrange.worker.restore import ParsedLogs, restore_with
from keyrange.worker.restorer import Prefetched, Restorer
from keyrange.worker.settings import WorkerSettings
from tests.logmodel import LiveRun, ModelReader, same_window

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0",
                          kafka_timeout_seconds=1.0)
T0_MS = 1_800_000_000_000


async def test_an_acquire_takes_a_read_ahead_that_does_not_end_without_waiting_for_its_end() -> None:
    reads: list[int] = []

    def endless(cut: threading.Event) -> Prefetched:
        # A read-ahead that would read for a long time: a slow broker answering from inside a log.
        deadline = time.monotonic() + 5
        while not cut.is_set() and time.monotonic() < deadline:
            reads.append(1)
            time.sleep(0.01)
        return Prefetched({0: 10}, ParsedLogs(), {("events", 0): 10 + len(reads)})

    read_ahead = ReadAhead(frozenset({0}), endless)
    while not reads:
        await asyncio.sleep(0.01)
    began = time.monotonic()
    taken = await asyncio.wait_for(read_ahead.finish(), 2)
    assert time.monotonic() - began < 1
    assert taken is not None and taken.reached[("events", 0)] > 10  # what it read is kept


class EndlessPartition:
    """A consumer of one partition that always has one more record: a read to its end never ends."""

    def __init__(self) -> None:
        self.next = 0

    def list_topics(self, topic: str | None = None, timeout: float | None = None) -> Any:
        return None

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.next = partitions[0].offset

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        record = FakeRecord(self.next)
        self.next += 1
        return [record]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False, **_: Any) -> tuple[int, int]:
        return 0, self.next + 100

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.next) for tp in tps]

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        pass

    def unassign(self) -> None:
        pass


class FakeRecord:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "events.processed"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


def test_a_read_cut_short_ends_just_past_the_last_record_it_handed_over() -> None:
    cut = threading.Event()
    handed: list[int] = []

    def each(span: Any, messages: list[Any]) -> None:
        handed.extend(m.offset() for m in messages)
        if len(handed) >= 3:
            cut.set()

    reader = LogReader(SETTINGS, consumer=EndlessPartition())  # type: ignore[arg-type]
    _, ends = reader.read({("events.processed", 0): 7}, each=each, cut=cut)
    assert handed[:3] == [7, 8, 9]
    assert ends == {("events.processed", 0): handed[-1] + 1}


def test_a_read_ahead_cut_short_is_finished_by_the_acquire_as_a_full_restore_would_restore() -> None:
    # 100 s of events at 100/s, committed at 6,000 when read ahead and at 8,000 at the grant.
    run = LiveRun(SETTINGS.ttl_seconds)
    for i in range(10_000):
        sent_ms = T0_MS + i * 10
        run.add(f"u{i}", sent_ms, sent_ms, (sent_ms + 50) / 1000)
    logs = {("events", 0): run.records, (SETTINGS.sink, 0): [], (SETTINGS.dlq, 0): [], (SETTINGS.state, 0): []}
    counts = {SETTINGS.topic: 1, SETTINGS.sink: 1, SETTINGS.dlq: 1, SETTINGS.state: 1}
    now_s = T0_MS / 1000 + 101
    reader = ModelReader(logs, committed={0: 6_000})
    cut = threading.Event()
    cut.set()  # the grant came before the read-ahead read anything
    with patch("keyrange.worker.restorer.LogReader", lambda _settings, **_options: reader):
        restorer = Restorer(SETTINGS, counts)
        try:
            prefetched = restorer.prefetch([0], now_s=now_s, cut=cut)
            assert not prefetched.logs.inputs.get(0)
            reader.committed = {0: 8_000}
            restored = restorer.restore_slots([0], prefetched, now_s=now_s + 5)[0]
        finally:
            restorer.close()
    full = restore_with(ModelReader(logs), SETTINGS, {0: 8_000}, counts, now_s + 5)[0]  # type: ignore[arg-type]
    assert restored.start_offset == full.start_offset == 8_000
    windows = []
    for seen in (restored.seen, full.seen):  # the catch-up's reaches further back: expired on replay
        window = TtlSet(SETTINGS.ttl_seconds, lambda: now_s + 5)
        for uuid, event_s in seen:
            window.replay(uuid, event_s)
        windows.append(window)
    assert same_window(windows[1], windows[0], run.uuids) == [] and len(windows[1]) > 500
