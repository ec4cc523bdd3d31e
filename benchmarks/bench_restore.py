"""Acquire after uptime: a slot's acquire time and peak RSS after N commits, for a small and a large N.

A slot's keyed-state changelog gets records on every commit (a totals record, and its clients'
changed states). One partition's changelog is written as N commits of the real slot code write it
(SlotState and Committer, 1 event and 1 changed client of CLIENTS per commit, snapshots as
they fall due), produced to the broker without transactions (fast; a read_committed read sees
the same records). The group's committed offset is set to N. Then a fresh process (so that its
peak RSS is the acquire's alone) starts a Worker and acquires the slot, twice over: with the
changelog read from the snapshot its committed offset vouches for (this code), and read from
offset 0 with every record held until parsed (the code before snapshots, emulated: the same
restore with the changelog's start forced to 0 and `LogReader.read` collecting lists). Each
figure is the median of REPEATS acquires, after one acquire not counted (a fresh broker's first
transactional producer is slow); reading 2 million records from 0 is measured once.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.harness import load_average, row, running_broker
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker import WorkerSettings
from keyrange.worker.committer import Committer
from keyrange.worker.restore import RestoredPartition
from keyrange.worker.slot import SlotMetrics, SlotState
from keyrange.worker.snapshots import CHANGELOG_TOPIC_CONFIG
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord

CLIENTS = 100
"""Live clients of the partition (each commit changes one of them)."""
FULL_COMMITS = (1_000, 1_000_000)
QUICK_COMMITS = (1_000, 20_000)
REPEATS = 3
SLOW_READ_RECORDS = 100_000
"""A read from offset 0 of more changelog records than this is measured once, not REPEATS times."""


class _PlainWrites:
    """Stands in for a slot's SlotTransactions: produces the changelog records without a
    transaction; a snapshot's first record's delivery report comes before `commit` returns."""

    def __init__(self, bootstrap: str, state_topic: str) -> None:
        self._state_topic = state_topic
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
                                   "queue.buffering.max.messages": 1_000_000, "log_level": 3})
        self.produced = 0

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition]) -> None:
        wait = False
        records = [r for r in records if r.topic == self._state_topic]  # not the processed records
        self.produced += len(records)
        for r in records:
            kwargs: dict[str, Any] = {"key": r.key, "value": r.value, "partition": r.partition,
                                      "headers": r.headers or []}
            if r.delivered is not None:
                kwargs["on_delivery"] = r.delivered
                wait = True
            while True:
                try:
                    self._producer.produce(r.topic, **kwargs)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        self._producer.poll(0)
        if wait:
            self.flush()

    def flush(self) -> None:
        """Wait until everything produced is acknowledged."""
        if self._producer.flush(120) != 0:
            raise RuntimeError("changelog records not acknowledged within 120 s")


def write_changelog(settings: WorkerSettings, commits: int) -> int:
    """Write `commits` commits of one slot to its changelog; commit the group's offset; return
    the changelog records written."""
    writes = _PlainWrites(settings.bootstrap, settings.state)
    slot = SlotState(0, 0, RestoredPartition(0), 10.0, time.time, SlotMetrics("bench", "w0", 0),
                     writes, 0)  # type: ignore[arg-type]
    committer = Committer(settings, lambda: [slot], WorkerStats())

    async def commit_all() -> None:
        for offset in range(commits):
            slot.admit(offset, 0, 0)
            processed = OutputRecord(settings.sink, 0, b"", b"")
            slot.finish_processed(offset, processed, offset % CLIENTS, str(offset).encode(), False)
            await committer.commit_now()

    asyncio.run(commit_all())
    writes.flush()
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": settings.group_id, "log_level": 3})
    try:
        consumer.commit(offsets=[TopicPartition(settings.topic, 0, commits)], asynchronous=False)
    finally:
        consumer.close()
    return writes.produced


ACQUIRE = r"""
import asyncio, json, resource, sys, time
from keyrange.handlers import load_handler
from keyrange.worker import Worker, WorkerSettings
from keyrange.worker import logreader, restore

settings = WorkerSettings(**json.loads(sys.argv[1]))
read = logreader.LogReader.read
changelog_records = 0

def read_all(self, starts, stops=None, each=None):
    global changelog_records
    if sys.argv[2] == "bounded":
        def counted(span, messages):
            global changelog_records
            changelog_records += len(messages) if span[0] == settings.state else 0
            if each is not None:
                each(span, messages)
        return read(self, starts, stops, each=counted)
    logs, ends = read(self, starts, stops)
    changelog_records += sum(len(m) for (topic, _), m in logs.items() if topic == settings.state)
    if each is None:
        return logs, ends
    for span, messages in logs.items():
        if messages:
            each(span, messages)
    return {span: [] for span in logs}, ends

logreader.LogReader.read = read_all
if sys.argv[2] == "from-zero":
    restore.changelog_starts = lambda reader, topic, committed: {(topic, p): 0 for p in committed}

async def main():
    worker = Worker(settings, load_handler("noop"))
    await worker.start()
    try:
        began = time.monotonic()
        await worker.acquire([0])
        took = time.monotonic() - began
    finally:
        await worker.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"acquire_ms": took * 1000, "peak_rss_mib": peak, "changelog_records": changelog_records}))

asyncio.run(main())
"""


def measure_acquire(settings: WorkerSettings, mode: str) -> dict[str, float]:
    """Acquire time and peak RSS of a fresh worker process acquiring slot 0."""
    fields = {"bootstrap": settings.bootstrap, "topic": settings.topic, "group_id": settings.group_id,
              "worker_id": "bench"}
    done = subprocess.run([sys.executable, "-c", ACQUIRE, json.dumps(fields), mode], capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the acquire ({mode}) failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(quick: bool, brokers: tuple[str, ...] = ("kafka", "tansu")) -> list[dict[str, Any]]:
    """Rows: acquire time and peak RSS per broker, N and way of reading the changelog."""
    rows = []
    for engine in brokers:
        with running_broker(engine) as bootstrap:
            written = []
            for commits in QUICK_COMMITS if quick else FULL_COMMITS:
                topic = f"restore-{commits}-{time.monotonic_ns()}"
                settings = WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=f"{topic}-g", worker_id="bench")
                ensure_topics(bootstrap, [TopicSpec(topic, 1), TopicSpec(settings.sink, 1), TopicSpec(settings.dlq, 1),
                                          TopicSpec(settings.state, 1, dict(CHANGELOG_TOPIC_CONFIG),
                                                    exact_partitions=True)], 60)
                began = time.monotonic()
                records = write_changelog(settings, commits)
                written.append((commits, settings, records, time.monotonic() - began))
            measure_acquire(written[0][1], "bounded")  # not counted: the broker's first acquire
            for commits, settings, records, wrote_s in written:
                for mode in ("bounded", "from-zero"):
                    load = load_average()
                    repeats = 1 if mode == "from-zero" and records > SLOW_READ_RECORDS else REPEATS
                    results = [measure_acquire(settings, mode) for _ in range(repeats)]
                    times = sorted(r["acquire_ms"] for r in results)
                    read = int(results[0]["changelog_records"])
                    where = "from the snapshot" if mode == "bounded" else "from offset 0"
                    notes = (f"{commits:,} commits, {records:,} changelog records (written in {wrote_s:.0f} s); "
                             f"read {read:,} of them ({where}); "
                             f"median of {repeats} (all: {', '.join(f'{t:,.0f}' for t in times)} ms); {load}")
                    rows.append(row(f"acquire after {commits:,} commits ({mode})", statistics.median(times), "ms",
                                    notes=notes, broker=engine))
                    rows.append(row(f"peak RSS of that acquire ({mode})",
                                    statistics.median(r["peak_rss_mib"] for r in results), "MiB", notes=notes,
                                    broker=engine))
    return rows
