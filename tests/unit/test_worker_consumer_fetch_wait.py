"""A waiting fetch gives way to a queued call (no Kafka: librdkafka assigns locally).

An idle worker's fetch waits up to FETCH_WAIT_SECONDS for a record; a handoff's assign or unassign,
or the stop's close, must not wait that out behind it (docs/worker.md, "One loop")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from keyrange.worker import consumer as consumer_module
from keyrange.worker.consumer import FETCH_WAIT_MAX_MS, ThreadedConsumer, consumer_config
from keyrange.worker.settings import WorkerSettings

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="t", group_id="g", kafka_timeout_seconds=0.2)
LONG_FETCH_WAIT_SECONDS = 60.0


def run_with_a_long_fetch_wait(monkeypatch: pytest.MonkeyPatch,
                               scenario: Callable[[ThreadedConsumer], Awaitable[None]]) -> None:
    """Run `scenario` on an opened consumer whose idle fetch waits LONG_FETCH_WAIT_SECONDS."""
    monkeypatch.setattr(consumer_module, "FETCH_WAIT_SECONDS", LONG_FETCH_WAIT_SECONDS)

    async def opened() -> None:
        consumer = ThreadedConsumer(SETTINGS)
        await consumer.open()
        try:
            await scenario(consumer)
        finally:
            await consumer.close()

    asyncio.run(opened())


def test_an_assign_queued_behind_a_waiting_fetch_runs_before_the_fetch_wait_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(consumer: ThreadedConsumer) -> None:
        fetch = asyncio.ensure_future(consumer.fetch())
        await asyncio.sleep(0.1)  # the fetch thread is in its wait
        assert not fetch.done()
        await asyncio.wait_for(consumer.assign({0: 5}), LONG_FETCH_WAIT_SECONDS / 4)
        assert await asyncio.wait_for(fetch, 1.0) == [], "the fetch gave way empty-handed"

    run_with_a_long_fetch_wait(monkeypatch, scenario)


def test_a_fetch_with_a_partition_paused_comes_back_soon_for_the_resume_and_waits_long_again_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine resumes a paused partition between two fetches: a long wait would idle it.
    async def scenario(consumer: ThreadedConsumer) -> None:
        await consumer.assign({0: 5, 1: 7})
        await consumer.pause([0])
        assert await asyncio.wait_for(consumer.fetch(), LONG_FETCH_WAIT_SECONDS / 4) == []
        await consumer.resume([0])
        fetch = asyncio.ensure_future(consumer.fetch())
        await asyncio.sleep(1.0)
        assert not fetch.done(), "nothing paused: the fetch waits its whole wait"
        await consumer.pause([1])  # a queued call: the fetch gives way
        await asyncio.wait_for(fetch, 1.0)
        await consumer.unassign([1])
        fetch = asyncio.ensure_future(consumer.fetch())
        await asyncio.sleep(1.0)
        assert not fetch.done(), "the paused partition was unassigned: nothing is paused"
        await consumer.assign({1: 7})
        await asyncio.wait_for(fetch, 1.0)

    run_with_a_long_fetch_wait(monkeypatch, scenario)


def test_the_broker_holds_an_idle_fetch_for_the_workers_wait_unless_the_user_says_otherwise() -> None:
    assert consumer_config(SETTINGS)["fetch.wait.max.ms"] == FETCH_WAIT_MAX_MS
    tuned = WorkerSettings(bootstrap="127.0.0.1:1", topic="t", group_id="g",
                           client_properties={"fetch.wait.max.ms": "10"})
    assert consumer_config(tuned)["fetch.wait.max.ms"] == "10"
