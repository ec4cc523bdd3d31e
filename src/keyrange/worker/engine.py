"""The worker engine: its lifecycle and which slots it holds.

An event's path, each hop a call into the module that owns its step: fetch (consumer.py) ->
its held slot (routing.py: a fetched batch at once; other workers' hash ranges skipped) ->
intake (intake.py: parse, skip, dedup, dead letters) -> per-client serial execution
(scheduler.py) -> attempts (attempts.py: retries, finishing the offset with its outputs) ->
commits (committer.py: one transaction per slot per interval) -> the slot's producer
(transactions.py). Each slot's bookkeeping is its SlotState (slot.py), written only by its own
methods. The committer returns what became of each slot's commit; the engine acts on a failed one
(`on_slot_failure`).

One asyncio loop owns all the bookkeeping. The Kafka consumer runs on one thread of its own
(ThreadedConsumer), each held slot's transactional producer on another (SlotTransactions), sync handlers on
a pool sized to the concurrency; async handlers are awaited on the loop. Slots (partitions) are
acquired and released explicitly (`acquire`, `release`) by whoever owns the range map: the
static `keyrange worker --partitions`, the local supervisor or the operator's control topic.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from types import MappingProxyType
from typing import Any

from confluent_kafka import KafkaException, Message

from keyrange import metrics as metric_defs
from keyrange.handlers import Handler
from keyrange.kafkaio import TopicSpec, ensure_topics, max_message_bytes, require_topic, until_reachable
from keyrange.kafkalog import RepeatSummary
from keyrange.kafkaquirks import Backoff, transaction_end_lock
from keyrange.ranges.layout import SlotLayout, SlotRouter
from keyrange.ranges.pauses import HandoffPauses
from keyrange.worker.attempts import AttemptRunner, Job
from keyrange.worker.committer import CommitOutcome, Committer, SlotCommit
from keyrange.worker.consumer import ThreadedConsumer
from keyrange.worker.health import Health
from keyrange.worker.intake import Intake
from keyrange.worker.logreader import RestoreError
from keyrange.worker.outputs import Outputs
from keyrange.worker.readahead import ReadAhead
from keyrange.worker.restorer import Restorer
from keyrange.worker.routing import BatchRouter
from keyrange.worker.scheduler import ClientScheduler
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.slot import SlotMetrics, SlotState
from keyrange.worker.slowsteps import reported_if_slow
from keyrange.worker.snapshots import CHANGELOG_TOPIC_CONFIG, slot_totals_key
from keyrange.worker.stalls import FetchStalls, PartitionFetch, Stall
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import SlotTransactions, TransactionFailed

log = logging.getLogger(__name__)
fetch_log = logging.getLogger("keyrange.worker.fetch")
"""Fetch errors come once per partition per fetch while a broker is away: summarised (kafkalog.py)."""
fetch_log.addFilter(RepeatSummary())

GAUGE_INTERVAL_SECONDS = 1.0


class SlotFailure(Enum):
    """What a worker does when a slot's producer fails (fenced, or it gave up retrying a commit)."""

    STOP_WORKER = "stop"
    """The worker fails with the slot's error (a restart resumes from the committed offsets)."""
    RELEASE = "release"
    """The slot is released without committing and the worker goes on; whoever assigns slots
    acquires it again if it is still this worker's (the range member, `keyrange worker` under a
    controller): a broker fault that aborted a transaction costs a re-acquire, not a restart."""
    REACQUIRE_IF_GAVE_UP = "reacquire"
    """Static slots: released without committing and acquired again in place when the worker gave
    the producer up (stuck, no commit within its deadline); any other failure, e.g. fenced
    by another producer of the slot, fails the worker (two workers may hold the same slots)."""


class _AcquireTicket:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


class Worker:
    """One worker: handles the events of the slots it holds, keeping the guarantees of docs/design.md."""

    def __init__(self, settings: WorkerSettings, handler: Handler, metrics: WorkerStats | None = None,
                 health: Health | None = None, on_slot_failure: SlotFailure = SlotFailure.STOP_WORKER,
                 consumer: ThreadedConsumer | None = None) -> None:
        self.settings = settings
        self.handler = handler
        self.on_slot_failure = on_slot_failure
        self.stats = metrics or WorkerStats()
        """Totals and recent latencies, for the CLI summary and tests (Prometheus is separate)."""
        self.handoff_pauses = HandoffPauses(settings.metrics_consumer, settings.worker_id)
        """Told of every event's start: measures the pause of slots acquired after a handoff."""
        self.health = health or Health()
        """What the liveness and readiness probes answer (health.py)."""
        self._slots: dict[int, SlotState] = {}
        self._slots_view = MappingProxyType(self._slots)
        self._by_partition: dict[int, list[SlotState]] = {}
        """Held slots by input partition (several when slots are hash ranges of partitions)."""
        self._layout: SlotLayout | None = None
        self._router: SlotRouter | None = None
        self._routing: BatchRouter[SlotState] | None = None
        """Routes fetched batches to the held slots; None after they changed (made again on use)."""
        self._fetches = 0
        """Fetches started so far (the one in flight, if any, is number `_fetches`)."""
        self._stale: dict[int, int] = {}
        """Partition -> the last fetch whose records of it are stale: it was re-assigned from a lower
        offset for a newly acquired slot (see `acquire`), or fetched afresh (`_refetch`), after that
        fetch began."""
        self._fetch_stalls = FetchStalls()
        """Which held partitions' fetch stalled (stalls.py), told each gauge tick."""
        self._acquiring: dict[int, _AcquireTicket] = {}
        self._losing: dict[int, asyncio.Task[None]] = {}
        """Slots whose producer failed, being released (see `_slot_failed`)."""
        self._consumer = consumer or ThreadedConsumer(settings)
        """The input's consumer; given, it is one the caller also holds (to act behind the engine's back)."""
        self._group_metadata: Any = None
        """The consumer's group metadata, for each slot's send_offsets_to_transaction."""
        self._warm_transactions: dict[int, SlotTransactions] = {}
        """Producers created for slots read ahead, not initialised (that would fence their owner)."""
        self._restorer: Restorer | None = None
        self._prefetch: ReadAhead | None = None
        """The newest read-ahead (readahead.py)."""
        self._pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="keyrange-handler")
        self._scheduler: ClientScheduler[Job] | None = None
        self._attempts: AttemptRunner | None = None
        self._outputs: Outputs | None = None
        self._intake: Intake | None = None
        self._committer: Committer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()
        """Released slots' producers being closed."""
        self._stopping = False
        self._failure: asyncio.Future[None] | None = None
        self._counts: dict[str, int] = {}
        self._held_gauge = metric_defs.HELD_SLOTS.labels(settings.metrics_consumer, settings.worker_id)
        self._fetch_stalls_counter = metric_defs.FETCH_STALLS.labels(settings.metrics_consumer, settings.worker_id)

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def held_slots(self) -> frozenset[int]:
        """Slots fully acquired and not released; a slot whose producer failed stays held until its
        release is done (its calls returned), so that nobody is told it is free while they run."""
        return frozenset(s for s, slot in self._slots.items() if not slot.revoked or s in self._losing)

    @property
    def slots(self) -> Mapping[int, SlotState]:
        """The held slots' state by slot, read-only (for probes and tests; the worker writes it)."""
        return self._slots_view

    @property
    def partition_count(self) -> int:
        """Partitions of the input topic (known after `start`)."""
        return self._counts[self.settings.topic]

    @property
    def partition_counts(self) -> Mapping[str, int]:
        """Partitions of each topic the worker reads or writes, by topic (known after `start`)."""
        return MappingProxyType(self._counts)

    @property
    def layout(self) -> SlotLayout:
        """How the input's partitions are cut into slots (after `start`; `use_layout` changes it)."""
        assert self._layout is not None, "worker not started"
        return self._layout

    def committed_positions(self) -> dict[int, int]:
        """Per held hash-range slot, the input offset its committed transactions count up to (what
        its member reports; a whole partition's is the group's committed offset, so none here)."""
        return {s: slot.committed_offset for s, slot in self._slots.items()
                if not slot.whole_partition and not slot.revoked}

    def use_slot_count(self, slot_count: int) -> None:
        """Hold slots of a range map of `slot_count` slots (the member's, from the publication)."""
        self.use_layout(SlotLayout.of_slot_count(self.partition_count, slot_count))

    def use_layout(self, layout: SlotLayout) -> None:
        """Hold slots of `layout` from now on (the range map's: layout.py). A worker holding slots
        cannot change layouts: ValueError."""
        if layout == self._layout:
            return
        if self._counts and layout.partitions != self.partition_count:
            raise ValueError(f"a layout of {layout.partitions} partitions does not fit topic {self.settings.topic!r}, "
                             f"which has {self.partition_count}")
        if self._slots or self._acquiring:
            raise ValueError(f"cannot change the slot layout while holding slots {sorted(self._slots)}")
        self._layout = layout
        self._router = SlotRouter(layout)
        self._routing = None
        if self._restorer is not None:
            self._restorer.layout = layout
        if self._intake is not None:
            self._intake.layout = layout

    async def start(self, stop: asyncio.Event | None = None) -> None:
        """Check the input topic, create the output topics, and connect. While Kafka does not
        answer this waits for it (one log line per try) until `stop` is set (StopRequested)."""
        s = self.settings
        loop = asyncio.get_running_loop()
        self._failure = loop.create_future()
        longest = s.kafka_timeout_seconds
        count = await until_reachable(lambda timeout: require_topic(
            s.bootstrap, s.topic, timeout, s.client_properties), stop, longest)
        specs = [
            TopicSpec(s.sink, count),
            TopicSpec(s.dlq, count),
            TopicSpec(s.state, count, dict(CHANGELOG_TOPIC_CONFIG), exact_partitions=True),
        ]
        outputs = await until_reachable(lambda timeout: ensure_topics(
            s.bootstrap, specs, timeout, s.client_properties, s.replication_factor), stop, longest)
        self._counts = {s.topic: count, **outputs}
        self._layout = self._layout if self._layout is not None else SlotLayout(count)
        self._router = SlotRouter(self._layout)
        self._routing = None
        self._restorer = Restorer(s, self._counts, self._layout)
        self._restorer.connect_next_reader()
        self._group_metadata = await self._consumer.open()
        limits = await until_reachable(lambda timeout: max_message_bytes(
            s.bootstrap, [s.sink, s.dlq, s.state], timeout, s.client_properties), stop, longest)
        self._outputs = Outputs(s, self._counts, limits)
        self._intake = Intake(count, s.restore_clock_slack_seconds, self._outputs, mapping=s.input_mapping)
        self._intake.layout = self._layout
        attempts = self._attempts = AttemptRunner(s, self.handler, self._outputs, self._pool, self.stats,
                                                  self.handoff_pauses)
        self.health.set_abandoned_source(lambda: attempts.abandoned, attempts.held_releases,
                                         max_abandoned=s.concurrency // 2)
        self._scheduler = ClientScheduler(attempts.run, s.concurrency, skip=lambda job: job.slot.revoked)
        self._committer = Committer(s, self._slots.values, self.stats)
        for loop_of in (self._fetch_loop, self._commit_loop, self._gauge_loop, self.health.beat_forever):
            self._tasks.append(loop.create_task(self._guard(loop_of)))
        self.health.mark_started()

    async def wait(self) -> None:
        """Return when the worker has stopped; raise the error that killed it, if any."""
        assert self._failure is not None, "worker not started"
        await asyncio.shield(self._failure)

    async def stop(self) -> None:
        """Graceful stop: stop fetching, finish in-flight events, commit, close."""
        if self._stopping:
            return
        self._stopping = True
        if self._prefetch is not None:
            self._prefetch.cut()
        for slot in self._slots.values():
            slot.transactions.stop_retrying()  # a commit waiting for Kafka must not hold up the stop
        held = list(self._slots) + list(self._acquiring)
        try:
            await self.release(held)
        except Exception:
            # The rest of the stop still runs; the next owner handles again what did not commit.
            log.exception("stop: releasing slots %s failed; what they did not commit is handled again by "
                          "their next owner", held)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._closing, return_exceptions=True)
        if self._scheduler is not None:
            await self._scheduler.cancel()
        await self._consumer.close()
        if self._restorer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._restorer.close)
        warm, self._warm_transactions = self._warm_transactions, {}
        await asyncio.gather(*(t.close() for t in warm.values()))
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(None)

    async def _guard(self, run: Callable[[], Awaitable[None]]) -> None:
        # Takes the coroutine function, not its coroutine: a task cancelled before it ran (a stop
        # right after the start) then leaves no coroutine that was never awaited.
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("worker failed")
            if self._failure is not None and not self._failure.done():
                self._failure.set_exception(exc)

    # --- ownership ---------------------------------------------------------------------------

    async def acquire(self, slots: Iterable[int]) -> None:
        """Restore the slots' state and dedup window, then resume them from their committed offsets."""
        wanted = sorted(set(slots))
        layout = self.layout
        for slot in wanted:
            if not 0 <= slot < layout.slot_count:
                cut = f", cut into {layout.per_partition} slots each" if layout.splits_partitions else ""
                raise ValueError(f"slot {slot} does not exist: topic {self.settings.topic!r} has "
                                 f"{self.partition_count} partitions{cut}")
        await self._losses_released(wanted)
        new = [s for s in wanted if s not in self._slots and s not in self._acquiring]
        if not new:
            return
        tickets = {s: _AcquireTicket() for s in new}
        self._acquiring.update(tickets)
        began = time.monotonic()
        assert self._restorer is not None, "worker not started"
        transactions = {s: self._slot_transactions(s) for s in new}
        read_ahead = self._take_read_ahead(new)
        try:
            # First fence every earlier owner of the slots (a zombie, a worker that followed a stale
            # map): from here on only this worker can commit them, and the transaction an earlier
            # owner left open is resolved before the restore reads the outputs. A read-ahead still
            # running goes on meanwhile, then stops where it got: the restore reads on from there.
            opening = time.monotonic()
            await reported_if_slow(asyncio.gather(*(t.open() for t in transactions.values())),
                                   f"acquiring slots {new}: initialising their producers")
            opened = time.monotonic()
            prefetched = await read_ahead.finish() if read_ahead is not None else None
            restore_began = time.monotonic()
            open_ms, finish_ms = (opened - opening) * 1000, (restore_began - opened) * 1000
            # Committed offsets are looked up by the restore's own consumer too: the worker's consumer
            # is busy fetching the slots that keep flowing.
            restored = await reported_if_slow(asyncio.get_running_loop().run_in_executor(
                None, self._restorer.restore_slots, new, prefetched), f"acquiring slots {new}: the restore")
            restore_ms = (time.monotonic() - restore_began) * 1000
        except BaseException:
            if read_ahead is not None:
                read_ahead.cut()
            await asyncio.gather(*(t.close() for t in transactions.values()), return_exceptions=True)
            raise
        finally:
            for s, ticket in tickets.items():
                if self._acquiring.get(s) is ticket:
                    del self._acquiring[s]
        assign: dict[int, int] = {}
        seek: dict[int, int] = {}
        taken: list[int] = []
        for s, ticket in tickets.items():
            if ticket.cancelled or self._stopping:
                await transactions[s].close()
                continue
            partition = layout.partition_of(s)
            start = restored[s].start_offset
            assert self._outputs is not None
            state = self._slots[s] = SlotState(
                s, partition, restored[s], self.settings.ttl_seconds, time.time,
                SlotMetrics(self.settings.metrics_consumer, self.settings.worker_id, layout.describe_slot(s)),
                transactions[s], self._outputs.output_partition(self.settings.sink, partition),
                slot_totals_key(layout, s), layout.per_partition)
            taken.append(s)
            siblings = self._by_partition.setdefault(partition, [])
            if partition in assign:
                assign[partition] = min(assign[partition], start)
            elif siblings:
                # The partition is fetched for another slot already: back to where this one resumes
                # (the others skip what they have seen: SlotState.admit). A fetch begun before the
                # re-assignment may return records past that offset: dropped, they come again.
                seek[partition] = min([start, seek.get(partition, start),
                                       *(sibling.next_offset for sibling in siblings)])
                self._stale[partition] = sys.maxsize  # until the re-assignment is queued behind the fetch
                if siblings[0].paused:
                    state.set_paused(True)  # its partition is paused for a sibling's backpressure
            else:
                assign[partition] = start
            siblings.append(state)
            self._routing = None
        try:
            await self._consumer.assign(assign)
        finally:
            # The consumer's calls run in order on its thread: a fetch begun after the re-assignment
            # is queued returns records from the new offsets (and if it is never queued, the
            # partition's other slots must not wait).
            self._stale.update(dict.fromkeys(seek, self._fetches))
        if seek:
            await self._consumer.seek(seek)
            await self._consumer.pause([p for p in seek if self._by_partition[p][0].paused])
        self._held_gauge.set(len(self.held_slots))
        log.info("acquired slots %s at offsets %s in %.0f ms (producers initialised %.0f ms, then the read-ahead "
                 "ended %.0f ms, restore %.0f ms%s; restored %d finished-after-commit offsets, %d uuids, %d client "
                 "states)", taken, {layout.describe_slot(s): restored[s].start_offset for s in taken},
                 (time.monotonic() - began) * 1000, open_ms, finish_ms, restore_ms,
                 " after a read-ahead" if prefetched else "",
                 sum(len(restored[s].finished_offsets) for s in taken),
                 sum(len(restored[s].seen) for s in taken), sum(len(restored[s].state) for s in taken))

    async def prefetch(self, slots: Iterable[int]) -> bool:
        """Read ahead the logs a later `acquire(slots)` restores from, while another worker still
        handles the slots, so that acquire only reads what was appended since (restorer.py).
        Returns whether the read-ahead succeeded; a failed one only makes the acquire read it all."""
        assert self._restorer is not None, "worker not started"
        wanted = frozenset(slots) - self.held_slots
        if not wanted:
            return True
        for slot in wanted - self._warm_transactions.keys():
            self._warm_transactions[slot] = self._new_slot_transactions(slot)
        restorer = self._restorer
        if self._prefetch is not None:
            self._prefetch.cut()  # a newer handoff's: the older one's acquire will not come
        read_ahead = self._prefetch = ReadAhead(wanted, lambda cut: restorer.prefetch(wanted, cut=cut))
        try:
            return await read_ahead.wait()  # False when an acquire cut it short: it was not read ahead
        except Exception as exc:  # noqa: BLE001 - the acquire restores in full instead
            log.warning("read-ahead of slots %s failed (%s); their acquire will read everything", sorted(wanted), exc)
            return False

    def _slot_transactions(self, slot: int) -> SlotTransactions:
        """The slot's producer: the one created by its read-ahead, or a new one."""
        warm = self._warm_transactions.pop(slot, None)
        return warm if warm is not None else self._new_slot_transactions(slot)

    def _new_slot_transactions(self, slot: int) -> SlotTransactions:
        assert self._outputs is not None, "worker not started"
        # Batches no larger than the smallest output topic takes: records that fit one by one could
        # still fail their transaction together, on every try.
        s = self.settings
        partition = self._outputs.output_partition(s.sink, self.layout.partition_of(slot))
        end_lock = transaction_end_lock(s.bootstrap, s.sink, partition)
        return SlotTransactions(s, slot, self._group_metadata, batch_bytes=self._outputs.batch_bytes, end_lock=end_lock)

    def _take_read_ahead(self, slots: list[int]) -> ReadAhead | None:
        """The read-ahead of exactly `slots`, or None; either way the read-ahead is dropped."""
        read_ahead, self._prefetch = self._prefetch, None
        if read_ahead is not None and read_ahead.slots != frozenset(slots):
            read_ahead.cut()  # of other slots: nothing will take it
            return None
        return read_ahead

    async def release(self, slots: Iterable[int], commit: bool = True) -> None:
        """Stop the slots: no new handler starts, in-flight calls finish, and (with `commit`) their
        outputs, state and offsets commit; then their state is dropped. Safe mid-acquire.

        In-flight calls include sync calls that timed out and whose thread still runs: until they
        return, their client is not free for the slot's next owner (guarantee 1), so this waits for
        them, however long; meanwhile `/healthz` fails, so that a call that never returns ends with
        a restart of the worker rather than holding the handoff for good (attempts.py).

        `commit=False` is for fencing (a newer epoch gave the slots away): the slots' uncommitted
        outputs are discarded with their offsets, so the new owner runs those events once. Either
        way, when this returns no transaction of this worker holding the slots' records is still in
        flight: one that was (the commit loop's) has committed, and is visible to the new owner's
        restore, which would otherwise miss its outputs and run those events again.
        """
        targets = set(slots)
        await self._losses_released(targets)
        for s in targets:
            ticket = self._acquiring.get(s)
            if ticket is not None:
                ticket.cancelled = True
        states = [self._slots[s] for s in sorted(targets) if s in self._slots]
        if not states:
            return
        began = time.monotonic()
        for slot in states:
            slot.revoke()
        # A partition stays assigned while another of its slots is held here. Its records fetched
        # meanwhile are skipped (revoked), so the in-flight calls need not wait for the unassign.
        unassigned = self._consumer.unassign(sorted({slot.partition for slot in states if all(
            other.revoked for other in self._by_partition[slot.partition])}))
        releasing = f"releasing slots {[slot.slot for slot in states]}"
        await reported_if_slow(asyncio.gather(unassigned, *(slot.drained() for slot in states)),
                               f"{releasing}: the consumer's unassign and the slots' handler calls")
        drained = time.monotonic()
        assert self._committer is not None
        joined = 0
        if commit:
            # Only the released slots (the others commit on their interval, off the handoff's path),
            # each in its transaction in flight when it can still join it: one commit instead of two.
            for outcome in await self._committer.commit_released(states):
                joined += outcome.joined
                self._slot_failed(outcome)
        await self._committer.idle(states)  # waits out a commit in flight; none starts before the removal
        for slot in states:
            slot.discard()
            if self._slots.get(slot.slot) is slot:
                del self._slots[slot.slot]
                siblings = self._by_partition[slot.partition]
                siblings.remove(slot)
                if not siblings:
                    del self._by_partition[slot.partition]
                self._routing = None
        # Nothing is left in the producers: they close after the release is reported (`stop` waits).
        closing = asyncio.get_running_loop().create_task(self._close_producers(states))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        self._held_gauge.set(len(self.held_slots))
        log.info("released slots %s in %.0f ms (in-flight calls %.0f ms, the transaction in flight and commit %.0f ms; "
                 "%d joined the transaction in flight)", [slot.slot for slot in states],
                 (time.monotonic() - began) * 1000, (drained - began) * 1000, (time.monotonic() - drained) * 1000,
                 joined)

    @staticmethod
    async def _close_producers(states: list[SlotState]) -> None:
        results = await asyncio.gather(*(slot.transactions.close() for slot in states), return_exceptions=True)
        for slot, result in zip(states, results, strict=True):
            if isinstance(result, Exception):
                log.warning("closing the producer of released slot %d failed: %s", slot.slot, result)

    async def _commit_loop(self) -> None:
        """Run the committer, acting on each slot whose transaction failed, until cancelled."""
        committer = self._committer
        assert committer is not None
        while True:
            failed = await committer.run()
            try:
                self._slot_failed(failed)
            except BaseException:
                await committer.cancel()  # the worker fails: as when `run` raises
                raise

    def _slot_failed(self, commit: SlotCommit) -> None:
        """Act on a slot's commit outcome: nothing unless its producer failed just now (FENCED or
        GAVE_UP); then, by `on_slot_failure`, raise its error (the worker, or the release, fails
        with it) or release the slot without committing (and maybe acquire it again). The committer
        commits nothing more of it either way."""
        exc = commit.error
        if exc is None or commit.outcome not in (CommitOutcome.FENCED, CommitOutcome.GAVE_UP):
            return
        policy = self.on_slot_failure
        if not self._stopping and (policy is SlotFailure.STOP_WORKER
                                   or (policy is SlotFailure.REACQUIRE_IF_GAVE_UP and not exc.gave_up)):
            raise exc
        slot = self._slots.get(commit.slot.slot)
        if slot is not commit.slot:
            return  # released meanwhile: nothing of it is left to release
        slot.revoke()
        if self._stopping:
            return  # the stop releases it; its uncommitted events run again from the committed offsets
        again = policy is SlotFailure.REACQUIRE_IF_GAVE_UP
        log.warning("%s; releasing slot %d without committing%s", exc, slot.slot,
                    " and acquiring it again" if again else " (acquired again if it is still this worker's)")
        self._losing[slot.slot] = asyncio.get_running_loop().create_task(
            self._guard(functools.partial(self._release_lost, slot.slot, again)))

    async def _release_lost(self, slot: int, again: bool) -> None:
        try:
            await self.release([slot], commit=False)
        finally:
            self._losing.pop(slot, None)
        backoff = Backoff()
        while again and not self._stopping:
            try:
                await self.acquire([slot])
                return
            # The fault that failed the producer, or a restore read that made no progress (a broker just
            # back: the next reader is a fresh one): a slot of a running worker is tried again.
            except (KafkaException, TransactionFailed, RestoreError) as exc:
                delay = backoff.failed()
                log.warning("acquiring slot %d again failed (%s); trying again in %.1f s", slot, exc, delay)
                await asyncio.sleep(delay)

    async def _losses_released(self, slots: Iterable[int]) -> None:
        """Wait until the slots among `slots` whose producer failed are released."""
        pending = [t for s in slots if (t := self._losing.get(s)) is not None and t is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending)

    # --- fetching and dispatch ---------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        while not self._stopping:
            self._fetches += 1
            messages = await self._consumer.fetch()
            if messages:
                if self._stale:
                    messages = self._fresh(messages)
                self._dispatch(messages)
            await self._apply_backpressure()

    def _dispatch(self, messages: list[Message]) -> None:
        scheduler, intake, attempts = self._scheduler, self._intake, self._attempts
        assert scheduler is not None and intake is not None and attempts is not None
        inline = self.handler.inline
        slots = self._slots
        routing = self._routing or self._new_routing()
        # Records of slots not held here (fetched just before a release, or another worker's hash
        # range: its owner handles them) are skipped by the routing, for the whole batch at once.
        batch = routing.route(messages)
        for m in batch.errors:
            fetch_log.warning("fetch error: %s", m.error())
        for slot, m in batch.own:
            job = intake.admit(slot, m, m.offset())  # type: ignore[arg-type]
            if job is not None:
                client = job.event.client_id
                # An inline handler runs here when its client is idle; a failed attempt is queued
                # for its retries like any other job (attempts.py).
                if not (inline and scheduler.can_run_now(client) and attempts.run_inline(job)):
                    scheduler.submit(client, job)
        routing.pass_ends(batch.ends)
        for slot in slots.values():
            if n := slot.take_consumed():
                slot.metrics.consumed.inc(n)
                self.stats.consumed += n

    def _fresh(self, messages: list[Message]) -> list[Message]:
        """The fetched records not of a partition re-assigned after this fetch began."""
        number = self._fetches
        stale = {p for p, last in self._stale.items() if last >= number}
        self._stale = {p: last for p, last in self._stale.items() if last > number}
        return [m for m in messages if m.partition() not in stale] if stale else messages

    def _new_routing(self) -> BatchRouter[SlotState]:
        assert self._router is not None, "worker not started"
        self._routing = BatchRouter(self._router, self._by_partition)
        return self._routing

    async def _apply_backpressure(self) -> None:
        limits = self.settings.max_pending, self.settings.max_pending_bytes
        # Per partition: the consumer pauses a partition, with every slot of it held here.
        to_pause: list[int] = []
        to_resume: list[int] = []
        for p, held in self._by_partition.items():
            if not held[0].paused and any(slot.wants_pause(*limits) for slot in held):
                to_pause.append(p)
            elif held[0].paused and all(slot.wants_resume(*limits) for slot in held):
                to_resume.append(p)
        if to_pause:
            await self._consumer.pause(to_pause)
            for p in to_pause:
                for slot in self._by_partition.get(p, []):
                    slot.set_paused(True)
            self.stats.pauses += len(to_pause)
        if to_resume:
            await self._consumer.resume(to_resume)
            for p in to_resume:
                for slot in self._by_partition.get(p, []):
                    slot.set_paused(False)

    # --- committing --------------------------------------------------------------------------

    async def commit_now(self) -> None:
        """Commit one transaction with every finished output, state change and committable offset."""
        if self._committer is not None:
            for outcome in await self._committer.commit_now():
                self._slot_failed(outcome)

    # --- gauges ------------------------------------------------------------------------------

    async def _gauge_loop(self) -> None:
        while True:
            await self.update_gauges()
            await asyncio.sleep(GAUGE_INTERVAL_SECONDS)

    async def update_gauges(self) -> None:
        """Refresh the per-partition gauges (dedup entries, pending, lag) and the stats snapshot."""
        states = list(self._slots.values())
        highs = await self._consumer.high_watermarks([slot.partition for slot in states]) if states else {}
        now_ms = time.time() * 1000
        lag_total = 0
        oldest_s = 0.0
        for slot in states:
            lag, age_s = slot.report(highs.get(slot.partition, -1), now_ms)
            lag_total += lag
            oldest_s = max(oldest_s, age_s)
        self.stats.lag_records = lag_total
        self.stats.lag_seconds = oldest_s
        self.stats.pending = sum(slot.pending for slot in states)
        self.stats.dedup_entries = sum(slot.dedup_entries for slot in states)
        await self._watch_fetch_stalls(highs)

    async def _watch_fetch_stalls(self, ends: Mapping[int, int]) -> None:
        """Fetch afresh each held partition whose fetch stalled (stalls.py), given the log ends."""
        def idle(held: list[SlotState]) -> bool:
            return not any(slot.paused or slot.revoked or slot.pending for slot in held)

        # The consumer's position passes a transactional input's commit markers, which it never
        # returns; asked only of partitions that may have stalled (none while records flow).
        maybe = [p for p, held in self._by_partition.items()
                 if idle(held) and ends.get(p, -1) > min(slot.next_offset for slot in held)]
        positions = await self._consumer.positions(maybe) if maybe else {}
        observed = {}
        for p, held in self._by_partition.items():  # as held after the await: the refetch queues with none between
            reading = min(slot.next_offset for slot in held)
            observed[p] = PartitionFetch(reading, max(reading, positions.get(p, -1)), ends.get(p, -1), idle(held))
        if stalls := self._fetch_stalls.observe(observed):
            await self._refetch(stalls)

    async def _refetch(self, stalls: list[Stall]) -> None:
        """Fetch the stalled partitions afresh from where their slots read next: assigned again,
        librdkafka's fetch state of them starts over. Queued on the consumer's thread with no await
        since `stalls` was taken from the held slots, so a release's unassign comes after it."""
        for stall in stalls:
            log.warning("%s: fetching it afresh from there (librdkafka can leave a partition's fetch waiting "
                        "after a broker restart or a leader change: docs/kafka.md)", stall.describe())
        self._fetch_stalls_counter.inc(len(stalls))
        offsets = {stall.partition: stall.offset for stall in stalls}
        # Records of them in the fetch in flight are dropped: they come again from these offsets (an
        # acquire's mark, until its re-assignment is queued, stays).
        for p in offsets:
            self._stale[p] = max(self._stale.get(p, 0), self._fetches)
        try:
            await self._consumer.seek(offsets)
        except KafkaException as exc:  # the watch tries again later; the worker goes on as it was
            log.warning("fetching partitions %s afresh failed: %s", sorted(offsets), exc)

