"""The worker's commits: every interval, one transaction with what finished since the last one.

A transaction carries every held partition's staged outputs (processed records, dead letters,
state changes), each partition's committable offset (the lowest unfinished one: commits.py) and,
with it, the partition's totals over the offsets below it. Counters count what a transaction
committed, never what was merely staged: staged outputs of a slot released without committing are
discarded, and its next owner produces (and counts) them again. The lock is shared with release,
so a release can wait out a commit in flight and know that no later one sees its slots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from confluent_kafka import TopicPartition

from keyrange import metrics as metric_defs
from keyrange.worker.commits import Totals
from keyrange.worker.partition import PartitionState
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord, TransactionalOutput


class Committer:
    """Commits the held partitions' finished work (module docstring)."""

    def __init__(self, settings: WorkerSettings, output: TransactionalOutput,
                 partitions: Callable[[], Iterable[PartitionState]], stats: WorkerStats) -> None:
        self._settings = settings
        self._output = output
        self._partitions = partitions
        self._stats = stats
        self._transactions = metric_defs.TRANSACTIONS.labels(settings.metrics_consumer, settings.worker_id)
        self.lock = asyncio.Lock()
        """Held while a transaction is built and committed."""

    async def run(self) -> None:
        """Commit every `commit_interval_ms`, until cancelled."""
        interval = self._settings.commit_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self.commit_now()

    async def commit_now(self) -> None:
        """Commit one transaction with every finished output, state change and committable offset."""
        s = self._settings
        async with self.lock:
            records: list[OutputRecord] = []
            offsets: list[TopicPartition] = []
            advanced: list[tuple[PartitionState, int, int, list[str], Totals | None]] = []
            for ps in list(self._partitions()):
                taken, processed, dead_letters = ps.take_outputs(s.state)
                records.extend(taken)
                committable = ps.window.committable
                totals = None
                if committable > ps.committed_offset:
                    offsets.append(TopicPartition(s.topic, ps.partition, committable))
                    record, totals = ps.totals_record(s.state, committable)
                    records.append(record)
                if totals is not None or processed or dead_letters:
                    advanced.append((ps, committable, processed, dead_letters, totals))
            if not records and not offsets:
                return
            await self._output.commit(records, offsets)
            self._transactions.inc()
            for ps, committable, processed, dead_letters, totals in advanced:
                self._count(ps, processed, dead_letters, totals)
                if totals is not None:
                    ps.committed_offset, ps.committed_totals = committable, totals

    def _count(self, ps: PartitionState, processed: int, dead_letters: list[str], totals: Totals | None) -> None:
        stats = self._stats
        if processed:
            ps.metrics.processed.inc(processed)
            stats.processed += processed
        for reason in dead_letters:
            ps.metrics.dead_letter(reason)
        stats.dead_letters += len(dead_letters)
        if totals is not None:
            dropped = totals.duplicates_dropped - ps.committed_totals.duplicates_dropped
            ps.metrics.duplicates.inc(dropped)
            stats.duplicates += dropped
