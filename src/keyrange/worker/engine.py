"""The worker engine: fetch -> dedup -> per-client serial execution -> transactional commit.

One asyncio loop owns all the bookkeeping. The Kafka consumer runs on one thread of its own
(ThreadedConsumer), the transactional producer on another (TransactionalOutput), sync handlers on
a pool sized to the concurrency; async handlers are awaited on the loop. Slots (partitions) are
acquired and released explicitly (`acquire`, `release`) by whoever owns the range map: the
static `keyrange worker --partitions`, the local supervisor or the operator's control topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Message, TopicPartition

from keyrange import metrics as metric_defs
from keyrange.events import BadEvent, InputEvent, dead_letter_headers, encode_processed, parse_input
from keyrange.handlers import Handler
from keyrange.kafkaio import TopicSpec, ensure_topics, require_topic
from keyrange.worker.consumer import ThreadedConsumer
from keyrange.worker.context import ClientState, HandlerContext
from keyrange.worker.partition import PartitionMetrics, PartitionState
from keyrange.worker.restore import STATE_HEADER
from keyrange.worker.restorer import Prefetched, Restorer
from keyrange.worker.scheduler import ClientScheduler
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord, TransactionalOutput

log = logging.getLogger(__name__)

GAUGE_INTERVAL_SECONDS = 1.0
MAX_RETRY_BACKOFF_SECONDS = 2.0


@dataclass(slots=True)
class _Job:
    """One event waiting for (or in) its handler call."""

    ps: PartitionState
    offset: int
    event: InputEvent
    key: bytes | None
    value: bytes


class _AcquireTicket:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


class Worker:
    """One worker: handles the events of the slots it holds, keeping the guarantees of docs/design.md."""

    def __init__(self, settings: WorkerSettings, handler: Handler, metrics: WorkerStats | None = None) -> None:
        self.settings = settings
        self.handler = handler
        self.stats = metrics or WorkerStats()
        """Totals and recent latencies, for the CLI summary and tests (Prometheus is separate)."""
        self._partitions: dict[int, PartitionState] = {}
        self._acquiring: dict[int, _AcquireTicket] = {}
        self._consumer = ThreadedConsumer(settings)
        self._output: TransactionalOutput | None = None
        self._restorer: Restorer | None = None
        self._prefetch: tuple[frozenset[int], asyncio.Future[Prefetched]] | None = None
        """The newest read-ahead: for which slots, and its result."""
        self._pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="keyrange-handler")
        self._scheduler: ClientScheduler[_Job] | None = None
        self._commit_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._failure: asyncio.Future[None] | None = None
        self._counts: dict[str, int] = {}
        self._labels = (settings.metrics_consumer, settings.worker_id)
        self._latency = metric_defs.EVENT_LATENCY.labels(*self._labels)
        self._handler_seconds = metric_defs.HANDLER_SECONDS.labels(*self._labels)
        self._transactions = metric_defs.TRANSACTIONS.labels(*self._labels)
        self._held_gauge = metric_defs.HELD_SLOTS.labels(*self._labels)

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def held_slots(self) -> frozenset[int]:
        """Slots fully acquired and not released."""
        return frozenset(p for p, ps in self._partitions.items() if not ps.revoked)

    @property
    def partition_count(self) -> int:
        """Partitions of the input topic (known after `start`)."""
        return self._counts[self.settings.topic]

    async def start(self) -> None:
        """Check the input topic, create the output topics, connect, and init transactions."""
        s = self.settings
        loop = asyncio.get_running_loop()
        self._failure = loop.create_future()
        count = await loop.run_in_executor(None, lambda: require_topic(
            s.bootstrap, s.topic, s.kafka_timeout_seconds, s.client_properties))
        specs = [
            TopicSpec(s.sink, count),
            TopicSpec(s.dlq, count),
            TopicSpec(s.state, count, {"cleanup.policy": "compact"}, exact_partitions=True),
        ]
        outputs = await loop.run_in_executor(None, lambda: ensure_topics(
            s.bootstrap, specs, s.kafka_timeout_seconds, s.client_properties, s.replication_factor))
        self._counts = {s.topic: count, **outputs}
        self._restorer = Restorer(s, self._counts)
        self._restorer.connect_next_reader()
        group_metadata = await self._consumer.open()
        self._output = TransactionalOutput(s, group_metadata)
        await self._output.open()
        self._scheduler = ClientScheduler(self._run_job, s.concurrency, skip=lambda job: job.ps.revoked)
        for coro in (self._fetch_loop(), self._commit_loop(), self._gauge_loop()):
            self._tasks.append(loop.create_task(self._guard(coro)))

    async def wait(self) -> None:
        """Return when the worker has stopped; raise the error that killed it, if any."""
        assert self._failure is not None, "worker not started"
        await asyncio.shield(self._failure)

    async def stop(self) -> None:
        """Graceful stop: stop fetching, finish in-flight events, commit, close."""
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(Exception):
            await self.release(list(self._partitions) + list(self._acquiring))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._scheduler is not None:
            await self._scheduler.cancel()
        await self._consumer.close()
        if self._restorer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._restorer.close)
        if self._output is not None:
            await self._output.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(None)

    async def _guard(self, coro: Any) -> None:
        try:
            await coro
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
        for slot in wanted:
            if not 0 <= slot < self.partition_count:
                raise ValueError(
                    f"slot {slot} does not exist: topic {self.settings.topic!r} has {self.partition_count} partitions"
                )
        new = [s for s in wanted if s not in self._partitions and s not in self._acquiring]
        if not new:
            return
        tickets = {s: _AcquireTicket() for s in new}
        self._acquiring.update(tickets)
        began = time.monotonic()
        assert self._restorer is not None, "worker not started"
        try:
            prefetched = await self._take_prefetch(new)
            restore_began = time.monotonic()
            # Committed offsets are looked up by the restore's own consumer too: the worker's consumer
            # is busy fetching the slots that keep flowing.
            restored = await asyncio.get_running_loop().run_in_executor(
                None, self._restorer.restore_slots, new, prefetched)
            restore_ms = (time.monotonic() - restore_began) * 1000
        finally:
            for s, ticket in tickets.items():
                if self._acquiring.get(s) is ticket:
                    del self._acquiring[s]
        assign: dict[int, int] = {}
        for s, ticket in tickets.items():
            if ticket.cancelled or self._stopping:
                continue
            pm = PartitionMetrics(self.settings.metrics_consumer, self.settings.worker_id, s)
            ps = PartitionState(s, restored[s], self.settings.ttl_seconds, time.time, pm)
            ps.output_partition = self._output_partition(self.settings.sink, ps)
            self._partitions[s] = ps
            assign[s] = restored[s].start_offset
        await self._consumer.assign(assign)
        self._held_gauge.set(len(self.held_slots))
        log.info("acquired slots %s at offsets %s in %.0f ms, restore %.0f ms%s (restored %d finished-after-commit "
                 "offsets, %d uuids, %d client states)", sorted(assign), assign,
                 (time.monotonic() - began) * 1000, restore_ms, " after a read-ahead" if prefetched else "",
                 sum(len(restored[s].finished_offsets) for s in assign),
                 sum(len(restored[s].seen) for s in assign), sum(len(restored[s].state) for s in assign))

    async def prefetch(self, slots: Iterable[int]) -> bool:
        """Read ahead the logs a later `acquire(slots)` restores from, while another worker still
        handles the slots, so that acquire only reads what was appended since (restorer.py).
        Returns whether the read-ahead succeeded; a failed one only makes the acquire read it all."""
        assert self._restorer is not None, "worker not started"
        wanted = frozenset(slots) - self.held_slots
        if not wanted:
            return True
        future = asyncio.get_running_loop().run_in_executor(None, self._restorer.prefetch, wanted)
        self._prefetch = (wanted, future)
        try:
            await asyncio.shield(future)
        except Exception as exc:  # noqa: BLE001 - the acquire restores in full instead
            log.warning("read-ahead of slots %s failed (%s); their acquire will read everything", sorted(wanted), exc)
            return False
        return True

    async def _take_prefetch(self, slots: list[int]) -> Prefetched | None:
        """The read-ahead of exactly `slots` (waiting for it if it still runs), or None; either way
        the read-ahead is dropped."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is None or prefetch[0] != frozenset(slots):
            return None
        try:
            return await prefetch[1]
        except Exception:  # noqa: BLE001 - logged by prefetch
            return None

    async def release(self, slots: Iterable[int], commit: bool = True) -> None:
        """Stop the slots: no new handler starts, in-flight calls finish, and (with `commit`) their
        outputs, state and offsets commit; then their state is dropped. Safe mid-acquire.

        `commit=False` is for fencing (a newer epoch gave the slots away): the slots' uncommitted
        outputs are discarded with their offsets, so the new owner runs those events once. Either
        way, when this returns no transaction of this worker holding the slots' records is still in
        flight: one that was (the commit loop's) has committed, and is visible to the new owner's
        restore, which would otherwise miss its outputs and run those events again.
        """
        targets = set(slots)
        for s in targets:
            ticket = self._acquiring.get(s)
            if ticket is not None:
                ticket.cancelled = True
        states = [self._partitions[s] for s in sorted(targets) if s in self._partitions]
        if not states:
            return
        began = time.monotonic()
        for ps in states:
            ps.revoked = True
        await self._consumer.unassign([ps.partition for ps in states])
        await asyncio.gather(*(ps.drained.wait() for ps in states))
        if commit:
            await self.commit_now()
        async with self._commit_lock:  # waits out an in-flight commit; no later one sees the slots
            for ps in states:
                ps.outputs.clear()
                ps.dirty_state.clear()
                if self._partitions.get(ps.partition) is ps:
                    del self._partitions[ps.partition]
                ps.metrics.remove()
        self._held_gauge.set(len(self.held_slots))
        log.info("released slots %s in %.0f ms", [ps.partition for ps in states], (time.monotonic() - began) * 1000)

    # --- fetching and dispatch ---------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        while not self._stopping:
            messages = await self._consumer.fetch()
            if messages:
                self._dispatch(messages)
            await self._apply_backpressure()

    def _dispatch(self, messages: list[Message]) -> None:
        scheduler = self._scheduler
        assert scheduler is not None
        partitions = self._partitions
        consumed: dict[int, int] = {}
        for m in messages:
            if m.error() is not None:
                log.warning("consumer error: %s", m.error())
                continue
            # A fetched record always has a partition and an offset (the stubs say Optional).
            ps = partitions.get(m.partition())  # type: ignore[arg-type]
            if ps is None or ps.revoked:
                continue  # fetched just before a release: the new owner handles it
            offset: int = m.offset()  # type: ignore[assignment]
            window = ps.window
            if offset < window.next_offset:
                continue  # delivered again (e.g. after resume): already in the window
            timestamp_ms = m.timestamp()[1]
            window.add(offset, timestamp_ms)
            consumed[ps.partition] = consumed.get(ps.partition, 0) + 1
            if offset in ps.skip:
                ps.skip.discard(offset)
                window.finish(offset)
                continue
            value = m.value()
            try:
                event = parse_input(value)
            except BadEvent as exc:
                self._dead_letter(ps, offset, m.key(), value, exc.reason, exc.detail, 0)
                window.finish(offset)
                continue
            # Event time is `created`; the record timestamp stands in when a producer left it out.
            if not ps.dedup.add_if_new(event.uuid, (event.created_ms or timestamp_ms) / 1000):
                ps.metrics.duplicates.inc()
                self.stats.duplicates += 1
                window.finish(offset)
                continue
            scheduler.submit(event.client_id, _Job(ps, offset, event, m.key(), value))  # type: ignore[arg-type]
        for p, n in consumed.items():
            partitions[p].metrics.consumed.inc(n)
            self.stats.consumed += n

    async def _apply_backpressure(self) -> None:
        limit = self.settings.max_pending
        to_pause = [ps for ps in self._partitions.values() if not ps.paused and ps.window.pending > limit]
        # Resume at half the limit, not just below it, so a partition does not flap every fetch.
        to_resume = [ps for ps in self._partitions.values() if ps.paused and ps.window.pending <= limit // 2]
        if to_pause:
            await self._consumer.pause([ps.partition for ps in to_pause])
            for ps in to_pause:
                ps.paused = True
                ps.metrics.paused.set(1)
            self.stats.pauses += len(to_pause)
        if to_resume:
            await self._consumer.resume([ps.partition for ps in to_resume])
            for ps in to_resume:
                ps.paused = False
                ps.metrics.paused.set(0)

    # --- running handlers --------------------------------------------------------------------

    async def _run_job(self, job: _Job) -> None:
        ps = job.ps
        if ps.revoked:
            return  # released after it was queued: not handled here, the offset stays unfinished
        ps.running += 1
        ps.drained.clear()
        try:
            event = job.event
            s = self.settings
            started_s = time.time()
            latency_s = started_s - event.created_ms / 1000
            self._latency.observe(latency_s)
            self.stats.note_latency(latency_s)
            function = self.handler.function
            attempt = 0
            while True:
                attempt += 1
                state = ClientState(ps.store.get(event.client_id))
                ctx = HandlerContext(client_id=event.client_id, partition=ps.partition, offset=job.offset,
                                     attempt=attempt, worker=s.worker_id, config=s.handler_config, state=state)
                t0 = time.perf_counter()
                try:
                    if self.handler.is_async:
                        result = await function(event.body, ctx)
                    else:
                        result = await asyncio.get_running_loop().run_in_executor(
                            self._pool, function, event.body, ctx
                        )
                    self._handler_seconds.observe(time.perf_counter() - t0)
                    key, value = encode_processed(event, ps.partition, job.offset, s.worker_id,
                                                  int(started_s * 1000), int(time.time() * 1000), result)
                    # The state also rides on the processed record, so "handled" and "its state"
                    # are one record that no torn transaction can split (restore.py).
                    state_headers = [(STATE_HEADER, orjson.dumps(state.staged))] if state.changed else None
                except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
                    self._handler_seconds.observe(time.perf_counter() - t0)
                    if ps.revoked:
                        return  # the slot moved: the new owner runs it again
                    if attempt <= s.max_retries:
                        backoff = min(s.retry_backoff_ms / 1000 * 2 ** (attempt - 1), MAX_RETRY_BACKOFF_SECONDS)
                        await asyncio.sleep(backoff)
                        continue
                    self._dead_letter(ps, job.offset, job.key, job.value, "handler-error",
                                      f"{type(exc).__name__}: {exc}", attempt)
                    ps.window.finish(job.offset)
                    return
                if state_headers is not None:
                    if state.staged is None:
                        ps.store.pop(event.client_id, None)
                        ps.dirty_state[event.client_id] = (None, job.offset)
                    else:
                        ps.store[event.client_id] = state.staged
                        ps.dirty_state[event.client_id] = (state_headers[0][1], job.offset)
                ps.outputs.append(OutputRecord(s.sink, ps.output_partition, key, value, state_headers))
                ps.processed_uncommitted += 1
                ps.window.finish(job.offset)
                return
        finally:
            ps.running -= 1
            if ps.running == 0:
                ps.drained.set()

    def _output_partition(self, topic: str, ps: PartitionState) -> int | None:
        # Same partition as the input when the layouts match, so a slot's outputs live in one
        # partition and restore reads only that one.
        return ps.partition if self._counts[topic] == self.partition_count else None

    def _dead_letter(self, ps: PartitionState, offset: int, key: bytes | None, value: bytes | None,
                     reason: str, detail: str, attempts: int) -> None:
        s = self.settings
        headers = dead_letter_headers(reason, detail, s.topic, ps.partition, offset, attempts)
        ps.outputs.append(OutputRecord(s.dlq, self._output_partition(s.dlq, ps), key, value, headers))
        ps.metrics.dead_letter(reason)
        self.stats.dead_letters += 1

    # --- committing --------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        interval = self.settings.commit_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self.commit_now()

    async def commit_now(self) -> None:
        """Commit one transaction with every finished output, state change and committable offset."""
        output = self._output
        if output is None:
            return
        async with self._commit_lock:
            records: list[OutputRecord] = []
            offsets: list[TopicPartition] = []
            advanced: list[tuple[PartitionState, int, int]] = []
            for ps in list(self._partitions.values()):
                taken, processed = ps.take_outputs(self.settings.state)
                records.extend(taken)
                committable = ps.window.committable
                if committable > ps.committed_offset or processed:
                    advanced.append((ps, committable, processed))
                if committable > ps.committed_offset:
                    offsets.append(TopicPartition(self.settings.topic, ps.partition, committable))
            if not records and not offsets:
                return
            await output.commit(records, offsets)
            self._transactions.inc()
            for ps, committable, processed in advanced:
                ps.committed_offset = max(ps.committed_offset, committable)
                if processed:
                    ps.metrics.processed.inc(processed)
                    self.stats.processed += processed

    # --- gauges ------------------------------------------------------------------------------

    async def _gauge_loop(self) -> None:
        while True:
            await self.update_gauges()
            await asyncio.sleep(GAUGE_INTERVAL_SECONDS)

    async def update_gauges(self) -> None:
        """Refresh the per-partition gauges (dedup entries, pending, lag) and the stats snapshot."""
        states = list(self._partitions.values())
        highs = await self._consumer.high_watermarks([ps.partition for ps in states]) if states else {}
        now_ms = time.time() * 1000
        lag_total = 0
        oldest_s = 0.0
        for ps in states:
            ps.dedup.expire()
            ps.metrics.dedup_entries.set(len(ps.dedup))
            ps.metrics.pending.set(ps.window.pending)
            high = highs.get(ps.partition, -1)
            lag = max(0, high - ps.window.committable) if high >= 0 else 0
            ps.metrics.lag.set(lag)
            lag_total += lag
            oldest = ps.window.oldest_timestamp_ms
            age_s = max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0
            ps.metrics.lag_seconds.set(age_s)
            oldest_s = max(oldest_s, age_s)
        self.stats.lag_records = lag_total
        self.stats.lag_seconds = oldest_s
        self.stats.pending = sum(ps.window.pending for ps in states)
        self.stats.dedup_entries = sum(len(ps.dedup) for ps in states)

