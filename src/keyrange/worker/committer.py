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
committing are discarded, and its next owner produces (and counts) them again. The loop starts no
transaction of a slot being released: its release (`commit_released`) adds what the slot has to
the transaction in flight if that one has not started to end (one commit ends both: on a starved
machine the loop runs a slot's transactions back to back, so one is almost always in flight), or
commits it in one of its own after it; either way no later transaction sees the slot.

Called by the engine (engine.py), which it never calls back: it reads the held slots through
`CommitSlot` (slot.py's SlotState) and returns each slot's outcome (`SlotCommit`); a slot whose
producer failed (fenced, or given up) never commits again here, and the engine decides what
becomes of it (release, re-acquire, or stop the worker).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from confluent_kafka import TopicPartition

from keyrange import metrics as metric_defs
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.slot import CommitBatch
from keyrange.worker.slowsteps import SLOW_STEP_SECONDS
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord, TransactionFailed

log = logging.getLogger(__name__)


class SlotProducer(Protocol):
    """What the committer needs of a slot's producer (transactions.py's SlotTransactions)."""

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        """Write `records` and commit `offsets` in one transaction, `last` once `records` were
        acknowledged; raise TransactionFailed."""

    def join(self, records: list[OutputRecord], offsets: list[TopicPartition],
             last: list[OutputRecord] | None = None) -> bool:
        """Add to the transaction in flight unless it started to end; whether they joined."""


class CommitSlot(Protocol):
    """What the committer needs of a held slot (slot.py's SlotState)."""

    @property
    def slot(self) -> int:
        """The slot's identity."""

    @property
    def transactions(self) -> SlotProducer:
        """The slot's producer."""

    def take_batch(self, topic: str, state_topic: str) -> CommitBatch | None:
        """Hand over what the slot's next transaction carries (None: nothing)."""

    def committed(self, batch: CommitBatch) -> None:
        """`batch`, the last one taken, committed."""

    @property
    def revoked(self) -> bool:
        """Being released: its release commits what it has."""


class CommitOutcome(Enum):
    """How a slot's commit ended."""

    COMMITTED = "committed"
    """Its transaction committed, or it had nothing to commit."""
    SLOT_LOST = "slot lost"
    """Its producer failed earlier: nothing of it commits any more (what it staged is discarded)."""
    FENCED = "fenced"
    """Kafka failed its producer now (fenced by another producer of the slot, or another fatal error)."""
    GAVE_UP = "gave up"
    """This worker gave its producer up now (stuck, no commit within its deadline, or stopping)."""


@dataclass(frozen=True, slots=True)
class SlotCommit:
    """One slot's commit outcome; `error` says why a FENCED or GAVE_UP one failed."""

    slot: CommitSlot
    outcome: CommitOutcome
    error: TransactionFailed | None = None
    joined: bool = False
    """A release's batch committed in the transaction that was in flight (`commit_released`)."""


class Committer:
    """Commits the held slots' finished work (module docstring)."""

    def __init__(self, settings: WorkerSettings, slots: Callable[[], Iterable[CommitSlot]],
                 stats: WorkerStats) -> None:
        self._settings = settings
        self._slots = slots
        self._stats = stats
        self._transactions = metric_defs.TRANSACTIONS.labels(settings.metrics_consumer, settings.worker_id)
        self._in_flight: dict[CommitSlot, asyncio.Task[SlotCommit]] = {}
        """Each slot's transaction in flight, if it has one."""
        self._lost: set[CommitSlot] = set()
        """Held slots whose producer failed: never committed again."""
        self._checked: dict[CommitSlot, float] = {}
        """When each held slot last started a transaction in `run`, or was found with nothing to commit."""
        self._started: set[asyncio.Task[SlotCommit]] = set()
        """The transactions `run` started and that have not ended."""
        self._failed: deque[SlotCommit] = deque()
        """Outcomes of `run`'s transactions that failed, for `run` to return."""
        self._failure: BaseException | None = None
        """What else failed a transaction that `run` started; `run` raises it when it wakes next."""
        self._an_end = asyncio.Event()
        """Set when a slot's transaction ends (or `run`'s next slot is due): wakes `run`."""
        self._joined: dict[CommitSlot, CommitBatch] = {}
        """A released slot's batch that joined its transaction in flight (`commit_released`)."""

    async def run(self) -> SlotCommit:
        """Start a transaction for each held slot with something to commit and none in flight, at
        most every `commit_interval_ms` per slot, until one of them fails: return its outcome
        (FENCED or GAVE_UP) for the caller to act on, and call again to go on. Raises what else
        failed a transaction. Cancelled, it cancels the transactions it started. A slot whose
        transaction outlasted the interval starts its next one as soon as it ends, not at the next
        tick: at a 20 ms interval a transaction takes about as long, and waiting for the tick made
        every other cycle 40 ms."""
        loop = asyncio.get_running_loop()
        interval = self._settings.commit_interval_ms / 1000
        try:
            while True:
                self._an_end.clear()
                if self._failure is not None:
                    raise self._failure
                if self._failed:
                    return self._failed.popleft()
                now = loop.time()
                present = list(self._slots())
                if self._lost:
                    self._lost.intersection_update(present)
                # A slot being released commits in its release (`commit_now`), once: a transaction
                # started here meanwhile would be waited out first, a second one inside the pause.
                held = [s for s in present if not s.revoked]
                # only the held slots; one not seen before is due at once (it has nothing yet, usually)
                checked = self._checked = {s: self._checked.get(s, -math.inf) for s in held}
                idle = [s for s in held if s not in self._in_flight]
                due = [s for s in idle if checked[s] + interval <= now]  # as `next_due` below
                for s in due:
                    checked[s] = now
                for task in self._start(due):
                    self._started.add(task)
                    task.add_done_callback(self._run_ended)
                next_due = min((checked[s] + interval for s in idle), default=now + interval)
                wake = loop.call_at(next_due, self._an_end.set)
                try:
                    await self._an_end.wait()  # the next slot due, or a transaction ended
                finally:
                    wake.cancel()
        except BaseException:
            await self.cancel()
            raise

    async def cancel(self) -> None:
        """Cancel the transactions `run` started and wait for them to end: what `run` does when it
        is cancelled or raises, and its caller does when it stops acting on a failure `run`
        returned. Only `run`'s own: a release's commit (commit_now) is its caller's to end."""
        started = list(self._started)
        for task in started:
            task.cancel()
        await asyncio.gather(*started, return_exceptions=True)

    async def commit_now(self, only: Collection[int] | None = None) -> list[SlotCommit]:
        """Commit, for every held slot with something to commit (or those of them whose `slot` is
        in `only`), its finished outputs, state changes and committable offset in one transaction,
        once its transaction in flight (if any) has ended; the slots' transactions run in parallel.
        A slot being released is its release's to commit (`commit_released`), in order. Returns each
        chosen slot's outcome; raises what else failed one of them."""
        while True:  # chosen again after each wait: a slot may have been released meanwhile
            chosen = [s for s in self._slots() if not s.revoked and (only is None or s.slot in only)]
            if not any(s in self._in_flight for s in chosen):
                break
            await self.idle(chosen)
        tasks = self._start(chosen)  # no await since the check: none of them has a transaction in flight
        results = await asyncio.gather(*tasks, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        ended = {r.slot: r for r in results if isinstance(r, SlotCommit)}
        return [ended.get(s) or SlotCommit(s, CommitOutcome.SLOT_LOST if s in self._lost else CommitOutcome.COMMITTED)
                for s in chosen]

    async def commit_released(self, slots: Collection[CommitSlot]) -> list[SlotCommit]:
        """Commit what each of `slots` (revoked: `run` starts no transaction of them) has: in its
        transaction in flight when that one has not started to end, else in one of its own once
        that one ended; the slots in parallel. Returns each slot's outcome (SLOT_LOST when its
        transaction in flight failed: `run` returns that failure); raises what else failed one.
        When it returns, none of `slots` has a transaction in flight."""
        results = await asyncio.gather(*(self._commit_released(slot) for slot in slots), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        return [r for r in results if isinstance(r, SlotCommit)]

    async def _commit_released(self, slot: CommitSlot) -> SlotCommit:
        s = self._settings
        batch = None if slot in self._lost else slot.take_batch(s.topic, s.state)
        in_flight = self._in_flight.get(slot)
        joined = False
        if in_flight is not None and batch is not None and slot.transactions.join(batch.records, batch.offsets,
                                                                                  batch.last):
            self._joined[slot] = batch  # before any await: its transaction's end in `_commit` sees it
            batch, joined = None, True
        await self.idle([slot])
        if in_flight is not None and in_flight.cancelled() and self._joined.pop(slot, None) is not None:
            # `cancel`: the worker stops or fails, and the joined batch's fate is its producer thread's
            raise TransactionFailed(f"slot {slot.slot}: the transaction its release joined was cancelled; what it "
                                    "did not commit runs again from the last committed offsets", gave_up=True)
        if slot in self._lost:
            return SlotCommit(slot, CommitOutcome.SLOT_LOST)
        if batch is None:  # it joined the transaction in flight, or had nothing to commit
            return SlotCommit(slot, CommitOutcome.COMMITTED, joined=joined)
        return await self._launch(slot, batch)

    async def idle(self, slots: Iterable[CommitSlot]) -> None:
        """Return once none of `slots` has a transaction in flight. Until the caller next awaits,
        none starts one: e.g. a release removes its slots right after, and no later transaction
        sees them."""
        slots = list(slots)
        began = time.monotonic()
        while running := [task for s in slots if (task := self._in_flight.get(s)) is not None]:
            done, _ = await asyncio.wait(running, timeout=SLOW_STEP_SECONDS)
            if not done:  # said here, not by reported_if_slow: its task would resume the caller a step late
                log.warning("slots %s: waiting for their transaction in flight: still waiting after %.0f s",
                            sorted(s.slot for s in slots if s in self._in_flight), time.monotonic() - began)

    def _start(self, slots: Iterable[CommitSlot]) -> list[asyncio.Task[SlotCommit]]:
        """Start a transaction for each of `slots` with something to commit (none in flight)."""
        s = self._settings
        tasks = []
        for slot in slots:
            if slot in self._lost:
                continue  # its producer failed: what it staged is discarded with it
            batch = slot.take_batch(s.topic, s.state)
            if batch is not None:
                tasks.append(self._launch(slot, batch))
        return tasks

    def _launch(self, slot: CommitSlot, batch: CommitBatch) -> asyncio.Task[SlotCommit]:
        """Start `slot`'s transaction of `batch` (none in flight)."""
        task = asyncio.get_running_loop().create_task(self._commit(slot, batch))
        self._in_flight[slot] = task
        task.add_done_callback(functools.partial(self._ended, slot))
        return task

    def _ended(self, slot: CommitSlot, task: asyncio.Task[SlotCommit]) -> None:
        if self._in_flight.get(slot) is task:
            del self._in_flight[slot]
        self._an_end.set()

    def _run_ended(self, task: asyncio.Task[SlotCommit]) -> None:
        """A transaction `run` started ended: keep a failure for `run` to return (or raise)."""
        self._started.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            if self._failure is None:
                self._failure = exc
        elif task.result().outcome is not CommitOutcome.COMMITTED:
            self._failed.append(task.result())

    async def _commit(self, slot: CommitSlot, batch: CommitBatch) -> SlotCommit:
        try:
            await slot.transactions.commit(batch.records, batch.offsets, batch.last)
        except TransactionFailed as exc:
            self._lost.add(slot)
            self._joined.pop(slot, None)  # failed with it: discarded, as what the slot staged
            return SlotCommit(slot, CommitOutcome.GAVE_UP if exc.gave_up else CommitOutcome.FENCED, exc)
        self._transactions.inc()
        for committed in (batch, self._joined.pop(slot, None)):  # in the order they were taken
            if committed is not None:
                slot.committed(committed)
                self._stats.note_committed(committed.processed, len(committed.dead_letters), committed.duplicates)
        return SlotCommit(slot, CommitOutcome.COMMITTED)
