"""The worker's commits: every interval, one transaction per slot with what finished since.

A slot's transaction carries its staged outputs (processed records, dead letters, state changes),
its committable offset (the lowest unfinished one: commits.py) and, with it, the slot's totals
over the offsets below it; the slots of a worker commit in parallel, each through its own
producer (transactions.py). Counters count what a transaction committed, never what was merely
staged: staged outputs of a slot released without committing are discarded, and its next owner
produces (and counts) them again. The lock is shared with release, so a release can wait out a
commit in flight and know that no later one sees its slots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from keyrange import metrics as metric_defs
from keyrange.worker.commits import Totals
from keyrange.worker.partition import PartitionState
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord, TransactionFailed


@dataclass(slots=True)
class _Batch:
    """What one slot's transaction carries, and what to count once it committed."""

    ps: PartitionState
    records: list[OutputRecord]
    offsets: list[TopicPartition]
    committable: int
    processed: int
    dead_letters: list[str]
    totals: Totals | None


class Committer:
    """Commits the held partitions' finished work (module docstring)."""

    def __init__(self, settings: WorkerSettings, partitions: Callable[[], Iterable[PartitionState]],
                 stats: WorkerStats,
                 slot_failed: Callable[[PartitionState, TransactionFailed], bool] = lambda ps, exc: False) -> None:
        self._settings = settings
        self._partitions = partitions
        self._slot_failed = slot_failed
        """Told of a slot whose transaction failed; True: the worker goes on without it (it is
        marked `lost` and never committed again), False: commit_now raises the error."""
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

    async def commit_now(self, only: Collection[int] | None = None) -> None:
        """Commit, for every held slot with something to commit (or those of them in `only`), its
        finished outputs, state changes and committable offset in one transaction; the slots'
        transactions run in parallel."""
        s = self._settings
        async with self.lock:
            batches: list[_Batch] = []
            for ps in list(self._partitions()):
                if ps.lost:
                    continue  # its producer failed: what it staged is discarded with it
                if only is not None and ps.partition not in only:
                    continue
                records, processed, dead_letters = ps.take_outputs(s.state)
                committable = ps.window.committable
                offsets: list[TopicPartition] = []
                totals = None
                if committable > ps.committed_offset:
                    offsets.append(TopicPartition(s.topic, ps.partition, committable))
                    record, totals = ps.totals_record(s.state, committable)
                    records.append(record)
                if records:
                    batches.append(_Batch(ps, records, offsets, committable, processed, dead_letters, totals))
            if not batches:
                return
            results = await asyncio.gather(*(b.ps.transactions.commit(b.records, b.offsets) for b in batches),
                                           return_exceptions=True)
            failure: BaseException | None = None
            for batch, result in zip(batches, results, strict=True):
                if isinstance(result, BaseException):
                    if not (isinstance(result, TransactionFailed) and self._slot_failed(batch.ps, result)):
                        failure = failure or result
                    continue
                self._transactions.inc()
                ps = batch.ps
                self._count(ps, batch.processed, batch.dead_letters, batch.totals)
                if batch.totals is not None:
                    ps.committed_offset, ps.committed_totals = batch.committable, batch.totals
            if failure is not None:
                raise failure

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
