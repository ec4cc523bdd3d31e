"""Running one event's handler: attempts, retries with backoff, and finishing its offset.

Called by the client scheduler (scheduler.py) for each queued job, and by the engine's dispatch for
an inline handler's first attempt. An attempt that returns finishes its offset on the slot with
the records it produced (built by outputs.py, staged by the slot: slot.py).

A failed attempt is retried after a backoff (doubling, capped) up to `max_retries` times, then the
event is dead-lettered; the client's later events wait meanwhile (order), other clients do not.
An attempt that has not returned after `handler_timeout_seconds` fails like an error, so a hung
call cannot block its client, its slot's commits and every handoff of its slot forever. An
async call is cancelled; a sync call cannot be (Python cannot stop a thread), so its thread is
left to finish on its own, its result ignored, and counted (`keyrange_handler_calls_abandoned`,
and the age of the oldest in `keyrange_handler_call_abandoned_seconds`). Until that thread returns
the call still holds its client: calls of one client never overlap (docs/design.md, guarantee 1),
so the retry, or the client's next event once the timed-out event is dead-lettered, waits for it,
and so does the release of its slot (`run` returns only then). The worker reports itself unhealthy
when half its threads are stuck that way, or when a release waits for such a call (health.py): a
restart is what ends a call that never returns. One watchdog keeps every call's deadline
(deadlines.py).
An `@inline` handler's first attempt runs at once, on the loop, where its event is admitted
(`run_inline`, when its client has nothing queued): no task, no thread, no deadline; if it fails,
the job joins its client's queue for the retries above, in the thread pool.
Each attempt gets a fresh context whose state is the client's committed state, so a failed
attempt leaves no trace (context.py). A slot released while an attempt runs is not retried here:
its new owner runs the event.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from keyrange import metrics as metric_defs
from keyrange.events import ClientId, InputEvent, encode_processed, json_bytes
from keyrange.handlers import Handler
from keyrange.inputmapping import SourceRecord
from keyrange.ranges.pauses import HandoffPauses
from keyrange.worker.context import ClientState, HandlerContext
from keyrange.worker.deadlines import CallDeadlines
from keyrange.worker.outputs import Outputs
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord

MAX_RETRY_BACKOFF_SECONDS = 2.0


class AttemptSlot(Protocol):
    """What running a job needs of its slot (slot.py's SlotState)."""

    @property
    def slot(self) -> int:
        """The slot's identity."""

    @property
    def partition(self) -> int:
        """The input topic's partition the slot reads."""

    @property
    def output_partition(self) -> int | None:
        """Sink partition of the slot's processed records (None: the producer picks by key)."""

    @property
    def revoked(self) -> bool:
        """Being released: nothing more of it starts."""

    def call_started(self) -> bool:
        """A handler call starts; False (and it does not) when the slot is revoked."""

    def call_ended(self) -> None:
        """A handler call that `call_started` ended."""

    def state_of(self, client: ClientId) -> bytes | None:
        """The client's committed state as JSON, or None."""

    def finish_processed(self, offset: int, record: OutputRecord, client: ClientId, state_json: bytes | None,
                         state_deleted: bool) -> None:
        """A handled event's offset finishes with its processed record and its client's new state."""

    def finish_dead_lettered(self, offset: int, record: OutputRecord | None, reason: str) -> None:
        """The event's offset finishes with its dead letter (None: not written)."""


@dataclass(slots=True)
class Job:
    """One event waiting for (or in) its handler call."""

    slot: AttemptSlot
    offset: int
    event: InputEvent
    key: bytes | None
    value: bytes
    started_s: float = 0.0
    """When its first attempt started (wall clock, seconds); 0 before."""
    attempts: int = 0
    """Attempts made so far (an inline first attempt that failed leaves 1)."""
    failure: str = ""
    """The last failed attempt's error, for its dead letter."""
    record: SourceRecord | None = None
    """The fetched record, whose headers and timestamp its dead letter keeps under an input mapping
    (outputs.py); None under the default mapping."""


class HandlerTimeout(Exception):
    """A handler call did not return within handler_timeout_seconds."""

    def __init__(self, message: str, still_running: Future[object] | None = None) -> None:
        super().__init__(message)
        self.still_running = still_running
        """The sync call's future, whose thread goes on: its client waits for it."""


class AbandonedCall(NamedTuple):
    """A sync call that timed out and whose thread still runs."""

    slot: AttemptSlot
    since: float
    """When it timed out (monotonic seconds)."""


class AttemptRunner:
    """Runs jobs for the client scheduler (module docstring)."""

    def __init__(self, settings: WorkerSettings, handler: Handler, outputs: Outputs, pool: ThreadPoolExecutor,
                 stats: WorkerStats, pauses: HandoffPauses | None = None) -> None:
        self._settings = settings
        self._handler = handler
        self._outputs = outputs
        self._pool = pool
        self._stats = stats
        self._pauses = pauses
        self._key_is_client = settings.input_mapping.client_id == "key"
        """The record key is the clientId as UTF-8, the processed record's key: not encoded again."""
        self._deadlines = CallDeadlines(settings.handler_timeout_seconds)
        labels = (settings.metrics_consumer, settings.worker_id)
        self._latency = metric_defs.EVENT_LATENCY.labels(*labels)
        self._handler_seconds = metric_defs.HANDLER_SECONDS.labels(*labels)
        self._timeouts = metric_defs.HANDLER_TIMEOUTS.labels(*labels)
        self._abandoned_gauge = metric_defs.HANDLER_CALLS_ABANDONED.labels(*labels)
        self._abandoned: dict[Future[object], AbandonedCall] = {}
        """Sync calls that timed out and whose thread still runs."""
        metric_defs.HANDLER_CALL_ABANDONED_SECONDS.labels(*labels).set_function(self.oldest_abandoned_seconds)

    @property
    def abandoned(self) -> int:
        """Sync calls that timed out and whose thread still runs. Any thread may ask."""
        return len(self._abandoned)

    def oldest_abandoned_seconds(self) -> float:
        """How long ago the oldest call still running timed out (0: none). Any thread may ask."""
        calls = tuple(self._abandoned.values())  # one C call: the loop may change the dict meanwhile
        return time.monotonic() - min(c.since for c in calls) if calls else 0.0

    def held_releases(self) -> str | None:
        """What keeps a release of a slot waiting on calls that timed out, or None. Any thread may ask."""
        held = [c for c in tuple(self._abandoned.values()) if c.slot.revoked]
        if not held:
            return None
        slots = ", ".join(str(p) for p in sorted({c.slot.slot for c in held}))
        oldest = time.monotonic() - min(c.since for c in held)
        return (f"the release of slot {slots} waits for {len(held)} handler call(s) that timed out (the oldest "
                f"{oldest:.0f} s ago) and still run: restart the worker to end them")

    async def run(self, job: Job) -> None:
        """Handle `job` to an outcome (processed or dead-lettered), unless its slot is released first."""
        slot = job.slot
        if not slot.call_started():
            return  # released after it was queued: not handled here, the offset stays unfinished
        try:
            await self._attempts(job)
        finally:
            slot.call_ended()

    def run_inline(self, job: Job) -> bool:
        """Run an inline handler's first attempt now; False when it failed (queue `job` for its retries)."""
        event, slot = job.event, job.slot
        started_s = self._started(job)
        state = ClientState(slot.state_of(event.client_id))
        partition = slot.partition
        t0 = time.perf_counter()
        try:
            result = self._handler.function(event.body, self._context(job, partition, 1, state))
            finished_s = time.time()
            self._handler_seconds.observe(time.perf_counter() - t0)
            key, value, state_json, deleted = self._encode(job, partition, result, state, started_s, finished_s)
        except Exception as exc:  # noqa: BLE001 - retried (then dead-lettered) by the queued path
            self._handler_seconds.observe(time.perf_counter() - t0)
            job.attempts, job.failure = 1, f"{type(exc).__name__}: {exc}"
            return False
        self._stage(job, key, value, state_json, deleted, 1)
        return True

    async def _attempts(self, job: Job) -> None:
        slot, s = job.slot, self._settings
        started_s = self._started(job)
        attempt = job.attempts
        running: Future[object] | None = None  # a timed-out sync call that may still run: its client waits for it
        while True:
            if attempt >= 1:  # an attempt failed: back off before the next one
                if not slot.revoked and attempt > s.max_retries:
                    slot.finish_dead_lettered(job.offset, self._outputs.dead_letter(
                        slot.partition, job.offset, job.key, job.value, "handler-error", job.failure, attempt,
                        job.event, job.record), "handler-error")
                await self._returned(running)
                running = None
                if slot.revoked or attempt > s.max_retries:
                    return  # dead-lettered, or the slot moved: the new owner runs it again
                await asyncio.sleep(min(s.retry_backoff_ms / 1000 * 2 ** (attempt - 1), MAX_RETRY_BACKOFF_SECONDS))
            attempt += 1
            state = ClientState(slot.state_of(job.event.client_id))
            t0 = time.perf_counter()
            try:
                result = await self._call(job, self._context(job, slot.partition, attempt, state))
                self._handler_seconds.observe(time.perf_counter() - t0)
                key, value, state_json, deleted = self._encode(job, slot.partition, result, state, started_s,
                                                               time.time())
            except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
                self._handler_seconds.observe(time.perf_counter() - t0)
                job.failure = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, HandlerTimeout):
                    running = exc.still_running
                continue
            self._stage(job, key, value, state_json, deleted, attempt)
            return

    @staticmethod
    async def _returned(running: Future[object] | None) -> None:
        """Wait until a timed-out sync call's thread has returned (at once when there is none)."""
        if running is not None and not running.done():
            await asyncio.wait([asyncio.wrap_future(running)])

    def _started(self, job: Job) -> float:
        """The first attempt's start time, observed once per event."""
        if job.started_s:
            return job.started_s
        event = job.event
        started_s = job.started_s = time.time()
        latency_s = started_s - event.created_ms / 1000
        self._latency.observe(latency_s)
        self._stats.note_latency(latency_s)
        if self._pauses is not None:
            self._pauses.started(job.slot.slot, started_s, event.created_ms)
        return started_s

    def _context(self, job: Job, partition: int, attempt: int, state: ClientState) -> HandlerContext:
        s = self._settings
        return HandlerContext(client_id=job.event.client_id, partition=partition, offset=job.offset,
                              attempt=attempt, worker=s.worker_id, config=s.handler_config, state=state)

    def _encode(self, job: Job, partition: int, result: object, state: ClientState, started_s: float,
                finished_s: float) -> tuple[bytes, bytes, bytes | None, bool]:
        """The processed record's key and value (the event read from input `partition`), the
        client's new state as JSON (None: unchanged or deleted) and whether the handler deleted it.
        Raises for a result or state that is not JSON-able, like a handler error."""
        key, value = encode_processed(job.event, partition, job.offset, self._settings.worker_id,
                                      int(started_s * 1000), int(finished_s * 1000), result,
                                      job.key if self._key_is_client else None)
        if not state.changed:
            return key, value, None, False
        staged = state.staged
        if staged is None:
            return key, value, None, True
        return key, value, json_bytes(staged), False

    def _stage(self, job: Job, key: bytes, value: bytes, state_json: bytes | None, deleted: bool,
               attempt: int) -> None:
        """Finish a handled event's offset with its outputs (dead-lettered when too large)."""
        slot, outputs = job.slot, self._outputs
        too_large = outputs.too_large(key, value, state_json)
        if too_large is not None:
            # Deterministic: a retry would produce the same output. The state change is dropped.
            slot.finish_dead_lettered(job.offset, outputs.dead_letter(
                slot.partition, job.offset, job.key, job.value, "output-too-large", too_large, attempt, job.event,
                job.record), "output-too-large")
            return
        slot.finish_processed(job.offset, outputs.processed(slot.output_partition, key, value, state_json, deleted),
                              job.event.client_id, state_json, deleted)

    async def _call(self, job: Job, ctx: HandlerContext) -> object:
        function, deadlines = self._handler.function, self._deadlines
        future: Future[object] | None = None
        call = deadlines.start()
        try:
            if self._handler.is_async:
                return await function(job.event.body, ctx)
            future = self._pool.submit(function, job.event.body, ctx)
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not deadlines.timed_out(call):
                raise
            self._timeouts.inc()
            timeout = deadlines.timeout_seconds
            if future is None:
                raise HandlerTimeout(f"the handler did not return within {timeout:g} s (cancelled)") from None
            self._abandon(future, job.slot)
            raise HandlerTimeout(f"the handler did not return within {timeout:g} s (its thread is left to "
                                 "finish; its result is ignored)", future) from None
        finally:
            deadlines.finish(call)

    def _abandon(self, future: Future[object], slot: AttemptSlot) -> None:
        loop = asyncio.get_running_loop()
        self._abandoned[future] = AbandonedCall(slot, time.monotonic())
        self._abandoned_gauge.set(len(self._abandoned))

        def returned(_: Future[object]) -> None:
            loop.call_soon_threadsafe(self._returned_late, future)

        future.add_done_callback(returned)

    def _returned_late(self, future: Future[object]) -> None:
        self._abandoned.pop(future, None)
        self._abandoned_gauge.set(len(self._abandoned))
