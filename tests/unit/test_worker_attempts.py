"""Calls of one client never overlap, also when a sync call times out (attempts.py): the retry, the
client's next event and the release of the slot all wait until the timed-out call's thread has
returned. Observed on the calls themselves (start and end of each, committed or not), through the
client scheduler and the attempt runner with a real thread pool and no Kafka."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from prometheus_client import REGISTRY

from keyrange.events import encode_input, parse_input
from keyrange.handlers import Handler
from keyrange.worker.attempts import AttemptRunner, Job
from keyrange.worker.health import Health
from keyrange.worker.outputs import Outputs
from keyrange.worker.scheduler import ClientScheduler
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.slot import SlotState
from keyrange.worker.stats import WorkerStats
from tests.calls import CallLog, assert_calls_never_overlap
from tests.slotstate import held_slot, take_staged

TIMEOUT_S = 0.2
OVERLAP_WINDOW_S = 1.0
"""How long each test gives a call that would overlap to start: the old code started the retry
after its 1 ms backoff, the next event at once."""


@contextmanager
def attempts(calls: CallLog, **overrides: object) -> Iterator[tuple[AttemptRunner, ClientScheduler[Job]]]:
    values: dict[str, object] = {"bootstrap": "x", "topic": "t", "group_id": "g", "worker_id": "w-attempts",
                                 "handler_timeout_seconds": TIMEOUT_S, "max_retries": 1, "retry_backoff_ms": 1,
                                 "concurrency": 4}
    values.update(overrides)
    s = WorkerSettings(**values)  # type: ignore[arg-type]
    outputs = Outputs(s, {s.topic: 1, s.sink: 1, s.dlq: 1, s.state: 1}, {})
    pool = ThreadPoolExecutor(max_workers=s.concurrency)
    try:
        runner = AttemptRunner(s, Handler("calls", calls.handler, is_async=False), outputs, pool, WorkerStats())
        yield runner, ClientScheduler(runner.run, s.concurrency, skip=lambda job: job.slot.revoked)
    finally:
        calls.let_all_return()
        pool.shutdown(wait=True)


def submit(scheduler: ClientScheduler[Job], slot: SlotState, offset: int, client: int) -> None:
    key, value = encode_input(client, f"u{offset}", int(time.time() * 1000))
    assert slot.admit(offset, int(time.time() * 1000), len(value))
    scheduler.submit(client, Job(slot, offset, parse_input(value), key, value))


async def until(condition: object, timeout_s: float) -> bool:
    """Whether `condition()` became true within `timeout_s` (polled)."""
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_a_retry_starts_only_after_the_timed_out_call_returned() -> None:
    calls = CallLog()
    calls.hold(offset=0, attempt=1)
    slot = held_slot()
    with attempts(calls) as (runner, scheduler):
        submit(scheduler, slot, 0, client=7)
        assert await until(lambda: runner.abandoned == 1, 10), "the first call did not time out"
        await until(lambda: len(calls.of(7)) > 1, OVERLAP_WINDOW_S)
        assert len(calls.of(7)) == 1, "the retry started while the timed-out call still ran"
        calls.let_return(offset=0, attempt=1)
        await asyncio.wait_for(scheduler.wait_idle(), 10)
    assert [c.attempt for c in calls.of(7)] == [1, 2]
    assert_calls_never_overlap(calls)
    staged = take_staged(slot)
    assert staged is not None and len(staged.outputs) == 1 and staged.processed == 1  # the retry succeeded


async def test_the_clients_next_event_waits_for_a_timed_out_call_but_its_dead_letter_does_not() -> None:
    calls = CallLog()
    calls.hold(offset=0, attempt=1)
    slot = held_slot()
    with attempts(calls, max_retries=0) as (runner, scheduler):
        submit(scheduler, slot, 0, client=7)
        submit(scheduler, slot, 1, client=7)
        submit(scheduler, slot, 2, client=8)
        # Dead-lettered at once (no retries), so the offset finishes while the call runs on.
        assert await until(lambda: slot.committable == 1, 10)  # offset 0 finished: only its dead letter can
        staged = take_staged(slot)
        assert staged is not None and staged.dead_letters == ["handler-error"]
        assert await until(lambda: [c.offset for c in calls.finished(8)] == [2], 10), "another client waited"
        await until(lambda: len(calls.of(7)) > 1, OVERLAP_WINDOW_S)
        assert [c.offset for c in calls.of(7)] == [0], "client 7's next event started during its timed-out call"
        assert runner.abandoned == 1
        calls.let_return(offset=0, attempt=1)
        await asyncio.wait_for(scheduler.wait_idle(), 10)
    assert [c.offset for c in calls.of(7)] == [0, 1]
    assert_calls_never_overlap(calls)
    assert runner.abandoned == 0


async def test_a_release_waits_for_a_timed_out_call_and_says_so_in_healthz_and_a_metric() -> None:
    calls = CallLog()
    calls.hold(offset=0, attempt=1)
    slot = held_slot()
    with attempts(calls, max_retries=5, concurrency=8) as (runner, scheduler):
        health = Health(max_abandoned=4)
        health.set_abandoned_source(lambda: runner.abandoned, runner.held_releases)
        health.beat()
        submit(scheduler, slot, 0, client=7)
        assert await until(lambda: runner.abandoned == 1, 10)
        alive, why = health.liveness()
        assert alive and "1 handler call(s) timed out and still run" in why
        labels = {"consumer": "g", "worker": "w-attempts"}
        assert (REGISTRY.get_sample_value("keyrange_handler_call_abandoned_seconds", labels) or 0) > 0
        slot.revoke()  # what a release (a handoff, a failed producer) does first; then it waits for `drained`
        await until(lambda: slot.running == 0, OVERLAP_WINDOW_S)
        assert slot.running == 1, "the slot was drained while its timed-out call still ran"
        alive, why = health.liveness()
        assert not alive and "the release of slot 0 waits for 1 handler call(s) that timed out" in why
        calls.let_return(offset=0, attempt=1)
        await asyncio.wait_for(slot.drained(), 10)
        await asyncio.wait_for(scheduler.wait_idle(), 10)
        assert health.liveness() == (True, "ok")
        assert REGISTRY.get_sample_value("keyrange_handler_call_abandoned_seconds", labels) == 0
    assert [c.attempt for c in calls.of(7)] == [1]  # not retried on a released slot: its next owner runs it
    assert_calls_never_overlap(calls)
    assert take_staged(slot) is None and slot.committable == 0
