"""The worker's commits: every interval, one transaction per slot with what finished since.

A slot's transaction carries its staged outputs (processed records, dead letters, state changes),
its committable offset (the lowest unfinished one: commitwindow.py) and, with it, the slot's totals
over the offsets below it; each slot commits through its own producer (transactions.py). Now and
then it also carries a snapshot of the slot's keyed state, which the totals records of the later
transactions name (snapshots.py): that keeps what a restore reads bounded.

Slots commit independently: at most one transaction of a slot is in flight, and the next starts
an interval after the last one started, or as soon as it ended if it took longer (what the slot
finishes meanwhile goes into it), so a slot stuck on Kafka (up to COMMIT_DEADLINE_SECONDS and
more) holds up neither the other slots' commits nor their releases. Counters count what a
transaction committed, never what was merely staged: staged outputs of a slot released without
committing are discarded, and its next owner produces (and counts) them again. A release waits
out its slots' commit in flight (`idle`) and knows that no later one sees them.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, TopicPartition

from keyrange import metrics as metric_defs
from keyrange.worker.commitwindow import Totals
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
    changelog_records: int
    snapshot: _SnapshotStart | None
    """Where the snapshot this transaction writes starts, if it writes one."""
    names_snapshot: int | None
    """The snapshot start its totals record names (None: no totals record, or none named)."""
    last: list[OutputRecord]
    """A hash-range slot's totals record: its position, written once the rest was acknowledged."""


class _SnapshotStart:
    """The offset of a snapshot's first record, from its delivery report (producer thread)."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset: int | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.offset = message.offset()


class Committer:
    """Commits the held partitions' finished work (module docstring)."""

    def __init__(self, settings: WorkerSettings, partitions: Callable[[], Iterable[PartitionState]],
                 stats: WorkerStats,
                 slot_failed: Callable[[PartitionState, TransactionFailed], bool] = lambda ps, exc: False) -> None:
        self._settings = settings
        self._partitions = partitions
        self._slot_failed = slot_failed
        """Told of a slot whose transaction failed; True: the worker goes on without it (it is
        marked `lost` and never committed again), False: the error fails the commit (the worker's,
        from `run`; the caller's, from `commit_now`)."""
        self._stats = stats
        self._transactions = metric_defs.TRANSACTIONS.labels(settings.metrics_consumer, settings.worker_id)
        self._in_flight: dict[PartitionState, asyncio.Task[None]] = {}
        """Each slot's transaction in flight, if it has one."""
        self._failure: BaseException | None = None
        """What failed a transaction that `run` started; `run` raises it when it wakes next."""
        self._an_end = asyncio.Event()
        """Set when a slot's transaction ends (or `run`'s next slot is due): wakes `run`."""

    async def run(self) -> None:
        """Start a transaction for each held slot with something to commit and none in flight, at
        most every `commit_interval_ms` per slot, until cancelled (which cancels those in flight)
        or one fails. A slot whose transaction outlasted the interval starts its next one as soon
        as it ends, not at the next tick: at a 20 ms interval a transaction takes about as long,
        and waiting for the tick made every other cycle 40 ms."""
        loop = asyncio.get_running_loop()
        interval = self._settings.commit_interval_ms / 1000
        checked: dict[PartitionState, float] = {}
        """When each held slot last started a transaction, or was found with nothing to commit."""
        started: set[asyncio.Task[None]] = set()
        try:
            while True:
                self._an_end.clear()
                if self._failure is not None:
                    raise self._failure
                now = loop.time()
                held = list(self._partitions())
                # only the held slots; one not seen before is due at once (it has nothing yet, usually)
                checked = {ps: checked.get(ps, -math.inf) for ps in held}
                idle = [ps for ps in held if ps not in self._in_flight]
                due = [ps for ps in idle if checked[ps] + interval <= now]  # as `next_due` below
                for ps in due:
                    checked[ps] = now
                for task in self._start(due):
                    started.add(task)
                    task.add_done_callback(started.discard)
                    task.add_done_callback(self._note_failure)
                next_due = min((checked[ps] + interval for ps in idle), default=now + interval)
                wake = loop.call_at(next_due, self._an_end.set)
                try:
                    await self._an_end.wait()  # the next slot due, or a transaction ended
                finally:
                    wake.cancel()
        finally:  # only its own: a release's commit (commit_now) is its caller's to end
            for task in started:
                task.cancel()
            await asyncio.gather(*started, return_exceptions=True)

    async def commit_now(self, only: Collection[int] | None = None) -> None:
        """Commit, for every held slot with something to commit (or those of them in `only`), its
        finished outputs, state changes and committable offset in one transaction, once its
        transaction in flight (if any) has ended; the slots' transactions run in parallel. Raises
        what failed one of them (unless `slot_failed` took the slot)."""
        while True:  # chosen again after each wait: a slot may have been released meanwhile
            chosen = [ps for ps in self._partitions() if only is None or ps.slot in only]
            if not any(ps in self._in_flight for ps in chosen):
                break
            await self.idle(chosen)
        tasks = self._start(chosen)  # no await since the check: none of them has a transaction in flight
        failures = [r for r in await asyncio.gather(*tasks, return_exceptions=True) if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def idle(self, states: Iterable[PartitionState]) -> None:
        """Return once none of `states` has a transaction in flight. Until the caller next awaits,
        none starts one: e.g. a release removes its slots right after, and no later transaction
        sees them."""
        states = list(states)
        while running := [task for ps in states if (task := self._in_flight.get(ps)) is not None]:
            await asyncio.wait(running)

    def _start(self, states: Iterable[PartitionState]) -> list[asyncio.Task[None]]:
        """Start a transaction for each of `states` with something to commit (none in flight)."""
        loop = asyncio.get_running_loop()
        tasks = []
        for ps in states:
            batch = self._batch(ps)
            if batch is None:
                continue
            task = loop.create_task(self._commit(batch))
            self._in_flight[ps] = task
            task.add_done_callback(functools.partial(self._ended, ps))
            tasks.append(task)
        return tasks

    def _ended(self, ps: PartitionState, task: asyncio.Task[None]) -> None:
        if self._in_flight.get(ps) is task:
            del self._in_flight[ps]
        self._an_end.set()

    def _note_failure(self, task: asyncio.Task[None]) -> None:
        """An interval's transaction ended: keep what failed it for `run` to raise."""
        if not task.cancelled() and (exc := task.exception()) is not None and self._failure is None:
            self._failure = exc

    def _batch(self, ps: PartitionState) -> _Batch | None:
        """Take what the slot's next transaction carries; None if nothing (or the slot is lost)."""
        if ps.lost:
            return None  # its producer failed: what it staged is discarded with it
        s = self._settings
        changelog_records = len(ps.dirty_state)
        records, processed, dead_letters = ps.take_outputs(s.state)
        committable = ps.window.committable
        offsets: list[TopicPartition] = []
        totals = None
        snapshot = None
        names = None
        take_snapshot = ps.snapshots.due(len(ps.store))
        last: list[OutputRecord] = []
        if committable > ps.committed_offset or take_snapshot or not ps.snapshots.named:
            # A whole partition's position is the group's offset; a hash range's, its totals record
            # (positions.py): the partition's other slots are at other offsets.
            if committable > ps.committed_offset and ps.whole_partition:
                offsets.append(TopicPartition(s.topic, ps.partition, committable))
            # A snapshot is every live client's state, then the totals record; it starts at its
            # first record (the totals record when no client has a state).
            written = ps.snapshot_records(s.state) if take_snapshot else []
            record, totals = ps.totals_record(s.state, committable)
            if ps.whole_partition:
                written.append(record)
            else:
                last.append(record)
            if take_snapshot:
                snapshot = (written or last)[0].delivered = _SnapshotStart()
            records.extend(written)
            changelog_records += len(written) + len(last)
            names = ps.snapshots.start
        if not records and not last:
            return None
        return _Batch(ps, records, offsets, committable, processed, dead_letters, totals, changelog_records,
                      snapshot, names, last)

    async def _commit(self, batch: _Batch) -> None:
        ps = batch.ps
        try:
            await ps.transactions.commit(batch.records, batch.offsets, batch.last)
        except TransactionFailed as exc:
            if not self._slot_failed(ps, exc):
                raise
            return
        self._transactions.inc()
        self._count(ps, batch.processed, batch.dead_letters, batch.totals)
        if batch.totals is not None:
            ps.committed_offset, ps.committed_totals = batch.committable, batch.totals
        snapshot_at = None if batch.snapshot is None else batch.snapshot.offset
        ps.snapshots.committed(batch.changelog_records, snapshot_at, batch.snapshot is not None, batch.names_snapshot)

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
