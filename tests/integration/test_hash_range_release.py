"""Releasing a hash range while the worker keeps the rest of its partition, on Apache Kafka and tansu.

A worker holding both halves of a partition's hash range releases one of them (a split gives it to
another worker) while it keeps fetching the partition for the other half. Records of the released
half fetched during its release are skipped (its next owner handles them), so its position must not
move past them: the records of the kept half that follow must not carry the released half's
committable offset along. Its next owner handles them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from keyrange.events import encode_input
from keyrange.handlers import Handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import make_producer
from keyrange.ranges.layout import SlotLayout
from keyrange.worker import Worker
from tests.integration.worker_helpers import settings_for, wait_for

LAYOUT = SlotLayout(1, 2)
"""One partition, its clients cut in two halves: slots 0 and 1."""


def clients_of(slot: int, count: int) -> list[int]:
    """The first `count` clientIds whose records belong to `slot`."""
    return [c for c in range(1000, 2000) if LAYOUT.slot_for_key(0, str(c).encode()) == slot][:count]


async def test_records_of_a_released_half_fetched_during_its_release_go_to_its_next_owner(
        any_bootstrap: str, topic_name: str) -> None:
    bootstrap = any_bootstrap
    (kept_client,), (held_up, moved_client) = clients_of(0, 1), clients_of(1, 2)
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    producer = make_producer(bootstrap)
    now = int(time.time() * 1000)

    def produce(client: int, uuid: str) -> None:
        key, value = encode_input(client, uuid, now)
        producer.produce(topic_name, value, key, partition=0)
        assert producer.flush(30) == 0

    called: dict[str, list[str]] = {"a": [], "b": []}
    gate = asyncio.Event()

    def handler_of(worker: str) -> Handler:
        async def handle(event: dict[str, Any], ctx: Any) -> None:
            called[worker].append(event["uuid"])
            if event["uuid"] == "held-up":
                await gate.wait()
        return Handler(f"recording-{worker}", handle, True)

    # Half 1 has one record, whose call is held up: its release waits for it.
    produce(kept_client, "k0")
    produce(held_up, "held-up")
    produce(kept_client, "k1")
    first = Worker(settings_for(bootstrap, topic_name, worker_id="a", concurrency=4), handler_of("a"))
    await first.start()
    try:
        first.use_layout(LAYOUT)
        await first.acquire([0, 1])
        await wait_for(lambda: {"k0", "held-up", "k1"} <= set(called["a"]), what="the first three records called")
        releasing = asyncio.ensure_future(first.release([1]))
        await asyncio.sleep(0)  # the release has begun: half 1 is being released
        assert not releasing.done()
        # Fetched during the release: a record of the released half, then one of the kept half.
        produce(moved_client, "moved-1")
        produce(kept_client, "k2")
        await wait_for(lambda: "k2" in called["a"], what="the kept half's record after the moved one")
        gate.set()
        await releasing
        assert first.held_slots == {0}
    finally:
        gate.set()
        await first.stop()

    second = Worker(settings_for(bootstrap, topic_name, worker_id="b", concurrency=4), handler_of("b"))
    await second.start()
    try:
        second.use_layout(LAYOUT)
        await second.acquire([1])
        produce(moved_client, "moved-2")  # the same client: handled after moved-1, if that is handled
        await wait_for(lambda: "moved-2" in called["b"], what="the next owner to handle half 1's new record")
    finally:
        await second.stop()
    assert "moved-1" not in called["a"]
    assert called["b"] == ["moved-1", "moved-2"], "half 1's position moved past a record nobody handled"


async def test_a_half_acquired_beside_the_fetched_other_half_gets_its_records_from_its_position(
        any_bootstrap: str, topic_name: str) -> None:
    # The worker fetches the partition for half 0, ahead of where half 1 resumes: acquiring half 1
    # seeks the partition back, and what was fetched before the seek must not move half 1 past
    # records the seek delivers again.
    bootstrap = any_bootstrap
    kept, moved = clients_of(0, 5), clients_of(1, 5)
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    producer = make_producer(bootstrap)
    now = int(time.time() * 1000)
    for i in range(200):
        client = (kept if i % 2 else moved)[i % 5]
        key, value = encode_input(client, f"e{i}", now)
        producer.produce(topic_name, value, key, partition=0)
    assert producer.flush(30) == 0
    expected = {f"e{i}" for i in range(0, 200, 2)}
    called: set[str] = set()

    async def record(event: dict[str, Any], ctx: Any) -> None:
        called.add(event["uuid"])

    stop = asyncio.Event()

    async def keep_producing() -> None:
        # Half 0's records keep arriving, so a fetch is under way whenever half 1 is acquired.
        n = 0
        while not stop.is_set():
            key, value = encode_input(kept[n % 5], f"k{n}", now)
            producer.produce(topic_name, value, key, partition=0)
            producer.poll(0)
            n += 1
            await asyncio.sleep(0.001)

    worker = Worker(settings_for(bootstrap, topic_name, worker_id="a", concurrency=8), Handler("record", record, True))
    await worker.start()
    producing = asyncio.ensure_future(keep_producing())
    try:
        worker.use_layout(LAYOUT)
        await worker.acquire([0])
        await wait_for(lambda: {f"e{i}" for i in range(1, 200, 2)} <= called, what="half 0's first records")
        await worker.acquire([1])
        await wait_for(lambda: expected <= called, timeout_seconds=20, what="every record of half 1 handled")
    finally:
        stop.set()
        await producing
        await worker.stop()
        producer.flush(30)
