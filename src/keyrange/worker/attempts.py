"""Running one event's handler: attempts, retries with backoff, and staging what it produced.

A failed attempt is retried after a backoff (doubling, capped) up to `max_retries` times, then the
event is dead-lettered; the client's later events wait meanwhile (order), other clients do not.
An attempt that has not returned after `handler_timeout_seconds` fails like an error, so a hung
call cannot block its client, its partition's commits and every handoff of its slot forever. An
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
from typing import NamedTuple

from keyrange import metrics as metric_defs
from keyrange.events import encode_processed, json_bytes
from keyrange.handlers import Handler
from keyrange.ranges.pauses import HandoffPauses
from keyrange.worker.commitwindow import Outcome
from keyrange.worker.context import ClientState, HandlerContext
from keyrange.worker.deadlines import CallDeadlines
from keyrange.worker.intake import Job
from keyrange.worker.outputs import OutputStage
from keyrange.worker.partition import PartitionState
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.stats import WorkerStats

MAX_RETRY_BACKOFF_SECONDS = 2.0


class HandlerTimeout(Exception):
    """A handler call did not return within handler_timeout_seconds."""

    def __init__(self, message: str, still_running: Future[object] | None = None) -> None:
        super().__init__(message)
        self.still_running = still_running
        """The sync call's future, whose thread goes on: its client waits for it."""


class AbandonedCall(NamedTuple):
    """A sync call that timed out and whose thread still runs."""

    ps: PartitionState
    since: float
    """When it timed out (monotonic seconds)."""


class AttemptRunner:
    """Runs jobs for the client scheduler (module docstring)."""

    def __init__(self, settings: WorkerSettings, handler: Handler, outputs: OutputStage, pool: ThreadPoolExecutor,
                 stats: WorkerStats, pauses: HandoffPauses | None = None) -> None:
        self._settings = settings
        self._handler = handler
        self._outputs = outputs
        self._pool = pool
        self._stats = stats
        self._pauses = pauses
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
        held = [c for c in tuple(self._abandoned.values()) if c.ps.revoked]
        if not held:
            return None
        slots = ", ".join(str(p) for p in sorted({c.ps.slot for c in held}))
        oldest = time.monotonic() - min(c.since for c in held)
        return (f"the release of slot {slots} waits for {len(held)} handler call(s) that timed out (the oldest "
                f"{oldest:.0f} s ago) and still run: restart the worker to end them")

    async def run(self, job: Job) -> None:
        """Handle `job` to an outcome (processed or dead-lettered), unless its slot is released first."""
        ps = job.ps
        if ps.revoked:
            return  # released after it was queued: not handled here, the offset stays unfinished
        ps.running += 1
        ps.drained.clear()
        try:
            await self._attempts(job)
        finally:
            ps.running -= 1
            if ps.running == 0:
                ps.drained.set()

    def run_inline(self, job: Job) -> bool:
        """Run an inline handler's first attempt now; False when it failed (queue `job` for its retries)."""
        ps, event = job.ps, job.event
        started_s = self._started(job)
        state = ClientState(ps.store.get(event.client_id))
        t0 = time.perf_counter()
        try:
            result = self._handler.function(event.body, self._context(job, 1, state))
            finished_s = time.time()
            self._handler_seconds.observe(time.perf_counter() - t0)
            key, value, state_json = self._encode(job, result, state, started_s, finished_s)
        except Exception as exc:  # noqa: BLE001 - retried (then dead-lettered) by the queued path
            self._handler_seconds.observe(time.perf_counter() - t0)
            job.attempts, job.failure = 1, f"{type(exc).__name__}: {exc}"
            return False
        self._stage(job, key, value, state, state_json, 1)
        return True

    async def _attempts(self, job: Job) -> None:
        ps, s = job.ps, self._settings
        started_s = self._started(job)
        attempt = job.attempts
        running: Future[object] | None = None  # a timed-out sync call that may still run: its client waits for it
        while True:
            if attempt >= 1:  # an attempt failed: back off before the next one
                if not ps.revoked and attempt > s.max_retries:
                    self._outputs.dead_letter(ps, job.offset, job.key, job.value, "handler-error",
                                              job.failure, attempt, job.event, job.record)
                    ps.window.finish(job.offset, Outcome.DEAD_LETTERED)
                await self._returned(running)
                running = None
                if ps.revoked or attempt > s.max_retries:
                    return  # dead-lettered, or the slot moved: the new owner runs it again
                await asyncio.sleep(min(s.retry_backoff_ms / 1000 * 2 ** (attempt - 1), MAX_RETRY_BACKOFF_SECONDS))
            attempt += 1
            state = ClientState(ps.store.get(job.event.client_id))
            t0 = time.perf_counter()
            try:
                result = await self._call(job, self._context(job, attempt, state))
                self._handler_seconds.observe(time.perf_counter() - t0)
                key, value, state_json = self._encode(job, result, state, started_s, time.time())
            except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
                self._handler_seconds.observe(time.perf_counter() - t0)
                job.failure = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, HandlerTimeout):
                    running = exc.still_running
                continue
            self._stage(job, key, value, state, state_json, attempt)
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
            self._pauses.started(job.ps.slot, started_s, event.created_ms)
        return started_s

    def _context(self, job: Job, attempt: int, state: ClientState) -> HandlerContext:
        s = self._settings
        return HandlerContext(client_id=job.event.client_id, partition=job.ps.partition, offset=job.offset,
                              attempt=attempt, worker=s.worker_id, config=s.handler_config, state=state)

    def _encode(self, job: Job, result: object, state: ClientState, started_s: float,
                finished_s: float) -> tuple[bytes, bytes, bytes | None]:
        """The processed record's key and value, and the client's new state as JSON (None: unchanged
        or deleted). Raises for a result or state that is not JSON-able, like a handler error."""
        key, value = encode_processed(job.event, job.ps.partition, job.offset, self._settings.worker_id,
                                      int(started_s * 1000), int(finished_s * 1000), result)
        state_json = json_bytes(state.staged) if state.changed and state.staged is not None else None
        return key, value, state_json

    def _stage(self, job: Job, key: bytes, value: bytes, state: ClientState, state_json: bytes | None,
               attempt: int) -> None:
        """Stage a handled event's outputs and finish its offset (dead-lettered when too large)."""
        ps = job.ps
        too_large = self._outputs.too_large(key, value, state_json)
        if too_large is not None:
            # Deterministic: a retry would produce the same output. The state change is dropped.
            self._outputs.dead_letter(ps, job.offset, job.key, job.value, "output-too-large", too_large, attempt,
                                      job.event, job.record)
            ps.window.finish(job.offset, Outcome.DEAD_LETTERED)
            return
        deleted = state.changed and state.staged is None
        self._outputs.processed(ps, job.offset, job.event.client_id, key, value, state_json, deleted)
        ps.window.finish(job.offset, Outcome.HANDLED)

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
            self._abandon(future, job.ps)
            raise HandlerTimeout(f"the handler did not return within {timeout:g} s (its thread is left to "
                                 "finish; its result is ignored)", future) from None
        finally:
            deadlines.finish(call)

    def _abandon(self, future: Future[object], ps: PartitionState) -> None:
        loop = asyncio.get_running_loop()
        self._abandoned[future] = AbandonedCall(ps, time.monotonic())
        self._abandoned_gauge.set(len(self._abandoned))

        def returned(_: Future[object]) -> None:
            loop.call_soon_threadsafe(self._returned_late, future)

        future.add_done_callback(returned)

    def _returned_late(self, future: Future[object]) -> None:
        self._abandoned.pop(future, None)
        self._abandoned_gauge.set(len(self._abandoned))
