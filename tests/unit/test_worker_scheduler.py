"""Per-client serial execution, global concurrency limit, no head-of-line blocking."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from keyrange.worker.scheduler import ClientScheduler


async def test_each_client_runs_serially_in_submission_order_with_a_global_limit() -> None:
    running: set[int] = set()
    peak = 0
    order: dict[int, list[int]] = defaultdict(list)
    rng = random.Random(1)

    async def run(item: tuple[int, int]) -> None:
        nonlocal peak
        client, seq = item
        assert client not in running, "two calls of one client overlapped"
        running.add(client)
        peak = max(peak, len(running))
        await asyncio.sleep(rng.random() / 1000)
        order[client].append(seq)
        running.discard(client)

    scheduler: ClientScheduler[tuple[int, int]] = ClientScheduler(run, concurrency=8)
    for seq in range(3000):
        client = rng.randrange(150)
        scheduler.submit(client, (client, seq))
    await asyncio.wait_for(scheduler.wait_idle(), 60)
    assert sum(len(v) for v in order.values()) == 3000
    assert all(seqs == sorted(seqs) for seqs in order.values())
    assert peak == 8
    assert scheduler.active_clients == 0 and scheduler.queued == 0


async def test_a_stuck_client_holds_one_permit_and_the_others_flow() -> None:
    gate = asyncio.Event()
    done: list[int] = []

    async def run(client: int) -> None:
        if client == 0:
            await gate.wait()
        done.append(client)

    scheduler: ClientScheduler[int] = ClientScheduler(run, concurrency=2)
    for _ in range(5):
        scheduler.submit(0, 0)
    for client in range(1, 200):
        scheduler.submit(client, client)
    for _ in range(100):
        await asyncio.sleep(0)
        if len(done) == 199:
            break
    assert sorted(done) == list(range(1, 200))
    gate.set()
    await asyncio.wait_for(scheduler.wait_idle(), 10)
    assert done.count(0) == 5


async def test_skipped_items_never_run_and_errors_do_not_stop_a_client() -> None:
    ran: list[int] = []

    async def run(item: int) -> None:
        if item == 2:
            raise RuntimeError("boom")
        ran.append(item)

    scheduler: ClientScheduler[int] = ClientScheduler(run, concurrency=4, skip=lambda item: item % 5 == 0)
    for item in range(1, 21):
        scheduler.submit(7, item)
    await asyncio.wait_for(scheduler.wait_idle(), 10)
    assert ran == [i for i in range(1, 21) if i % 5 and i != 2]


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        ClientScheduler(lambda item: asyncio.sleep(0), concurrency=0)


async def test_an_item_may_run_at_once_only_when_its_client_is_idle_and_a_permit_is_free() -> None:
    gate = asyncio.Event()

    async def run(item: int) -> None:
        await gate.wait()

    scheduler: ClientScheduler[int] = ClientScheduler(run, concurrency=2)
    assert scheduler.can_run_now(1)
    scheduler.submit(1, 0)
    await asyncio.sleep(0)
    assert not scheduler.can_run_now(1), "client 1 has an item running: a new one must queue behind it"
    assert scheduler.can_run_now(2)
    scheduler.submit(2, 0)
    await asyncio.sleep(0)
    assert not scheduler.can_run_now(3), "every permit is taken"
    scheduler.submit(3, 0)  # waits for a permit
    gate.set()
    await asyncio.wait_for(scheduler.wait_idle(), 5)
    assert all(scheduler.can_run_now(client) for client in (1, 2, 3))
