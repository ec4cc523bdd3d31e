"""Calls of one client never overlap across owners either (docs/design.md, guarantee 1), also when a
sync call timed out and its thread runs on: a release (a handoff, or a slot whose producer failed)
is done, and the slot reported free, only once every call of the slot has returned. Observed on the
calls themselves, start and end of each, committed or not (tests/calls.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from keyrange.events import encode_input
from keyrange.handlers import Handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker import Worker
from keyrange.worker.engine import SlotFailure
from tests.calls import CallLog, assert_calls_never_overlap
from tests.checkers import check_all
from tests.integration.worker_helpers import settings_for, wait_for
from tests.kafkatools import read_counts, read_input_log, read_processed

CLIENT = 7
"""The client whose first event's first call times out and is held."""
OVERLAP_WINDOW_S = 1.0
"""How long a test gives what must not happen (the slot reported free, a call that would overlap) to
happen: each took milliseconds before the fix."""


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    """`count` events, uuids e<first>..; every fourth one is CLIENT's, the first of all too."""
    producer = Producer({"bootstrap.servers": bootstrap})
    now = int(time.time() * 1000)
    for i in range(first, first + count):
        key, value = encode_input(CLIENT if i % 4 == 0 else 100 + i % 5, f"e{i}", now)
        producer.produce(topic, value, key, partition=0, timestamp=now)
    assert producer.flush(30) == 0


def abandoned(worker: Worker) -> float:
    labels = {"consumer": worker.settings.group_id, "worker": worker.settings.worker_id}
    return REGISTRY.get_sample_value("keyrange_handler_calls_abandoned", labels) or 0.0


async def bounded_wait(condition: object) -> None:
    """Give `condition` OVERLAP_WINDOW_S to become true; the caller asserts it did not."""
    deadline = time.monotonic() + OVERLAP_WINDOW_S
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.01)


async def test_a_handoff_waits_for_a_timed_out_call_and_the_new_owner_starts_after_it(
        any_bootstrap: str, topic_name: str) -> None:
    bootstrap = any_bootstrap
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    produce(bootstrap, topic_name, 0, 40)
    log = read_input_log(bootstrap, topic_name, 40)
    calls = CallLog()
    calls.hold(offset=0, attempt=1)
    handler = Handler("calls", calls.handler, is_async=False)
    settings = settings_for(bootstrap, topic_name, handler_timeout_seconds=0.5, max_retries=5, retry_backoff_ms=1,
                            concurrency=4)
    old, new = Worker(settings, handler), Worker(dataclasses.replace(settings, worker_id="w1"), handler)
    await old.start()
    await new.start()
    try:
        await old.acquire([0])
        await wait_for(lambda: abandoned(old) == 1, what="the first call of client 7 to time out")
        await bounded_wait(lambda: len(calls.of(CLIENT)) > 1)
        assert len(calls.of(CLIENT)) == 1, "a call of client 7 started while its timed-out call still ran"
        release = asyncio.ensure_future(old.release([0]))  # the handoff's first step
        await bounded_wait(release.done)
        assert not release.done(), "the old owner released the slot while a call of it still ran"
        alive, why = old.health.liveness()
        assert not alive and "the release of slot 0 waits for 1 handler call(s) that timed out" in why
        calls.let_return(offset=0, attempt=1)
        await asyncio.wait_for(release, 30)
        assert old.held_slots == frozenset() and old.health.liveness() == (True, "ok")
        await new.acquire([0])  # only now: the controller grants a slot once its old owner reported it released
        await wait_for(lambda: new.stats.processed + old.stats.processed >= 40, what="every event handled")
    finally:
        calls.let_all_return()
        await old.stop()
        await new.stop()
    mine = calls.of(CLIENT)
    assert (mine[0].worker, mine[0].offset) == ("w0", 0) and (mine[1].worker, mine[1].offset) == ("w1", 0)
    assert_calls_never_overlap(calls)
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 40),
              read_counts(bootstrap, topic_name, settings.group_id, covering=40))


async def test_a_slot_whose_producer_failed_stays_held_until_its_timed_out_call_returned(
        kafka_bootstrap: str, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """Apache Kafka only: fencing a busy producer on tansu can leave its transaction open for good
    (test_worker_fenced_in_place.py)."""
    bootstrap = kafka_bootstrap
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    produce(bootstrap, topic_name, 0, 20)
    calls = CallLog()
    calls.hold(offset=0, attempt=1)
    settings = settings_for(bootstrap, topic_name, handler_timeout_seconds=0.5, max_retries=5, retry_backoff_ms=1,
                            concurrency=4)
    worker = Worker(settings, Handler("calls", calls.handler, is_async=False), on_slot_failure=SlotFailure.RELEASE)
    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(lambda: abandoned(worker) == 1, what="the first call of client 7 to time out")
        fencer = Producer({"bootstrap.servers": bootstrap, "transactional.id": settings.slot_transactional_id(0)})
        with caplog.at_level(logging.WARNING, logger="keyrange.worker.engine"):
            fencer.init_transactions(30)  # the worker's producer of slot 0 is fenced from now on
            produce(bootstrap, topic_name, 20, 20)  # outputs to commit: the commit meets the fence
            await wait_for(lambda: "releasing slot 0 without committing" in caplog.text, what="the slot to fail")
        await bounded_wait(lambda: 0 not in worker.held_slots)
        assert worker.held_slots == {0}, "the slot was reported free while a call of it still ran"
        alive, why = worker.health.liveness()
        assert not alive and "the release of slot 0 waits" in why
        calls.let_return(offset=0, attempt=1)
        await wait_for(lambda: worker.held_slots == frozenset(), what="the failed slot's release")
        await worker.acquire([0])  # what its range member does when the slot is still this worker's
        await wait_for(lambda: worker.stats.processed >= 40, what="every event handled after the re-acquire")
    finally:
        calls.let_all_return()
        await worker.stop()
    assert [c.offset for c in calls.of(CLIENT)][:2] == [0, 0]  # the held call, then its run after the re-acquire
    assert_calls_never_overlap(calls)
    log = read_input_log(bootstrap, topic_name, 40)
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 40),
              read_counts(bootstrap, topic_name, settings.group_id, covering=40))
