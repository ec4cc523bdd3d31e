"""The worker's lag (`keyrange_consumer_lag`) while a partition is paused for backpressure.

A paused partition gets no fetch responses, so the high watermark they carry freezes; on
Apache Kafka, ListOffsets keeps the lag true while records keep arriving. On tansu (whose
ListOffsets answers too low after a batched produce) the lag may lag behind, but it is never
higher than the truth.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from keyrange.handlers import Handler
from keyrange.worker import Worker
from tests.checkers import check_all, first_occurrences
from tests.conftest import BrokerUnderTest
from tests.integration.worker_helpers import produce_stream, settings_for, wait_for
from tests.kafkatools import read_counts, read_input_log, read_processed

BEFORE, WHILE_PAUSED = 600, 400


async def test_lag_counts_records_that_arrive_while_a_partition_is_paused(broker_engine: BrokerUnderTest,
                                                                        topic_name: str) -> None:
    bootstrap = broker_engine.bootstrap
    produce_stream(bootstrap, topic_name, BEFORE, partitions=1, clients=40, duplicate_ratio=0.0)
    gate = asyncio.Event()

    async def gated(event: dict[str, Any], ctx: Any) -> None:
        await gate.wait()

    settings = settings_for(bootstrap, topic_name, concurrency=4, max_pending=20, fetch_batch_size=10)
    worker = Worker(settings, Handler("gated", gated, True))
    labels = {"consumer": settings.group_id, "worker": "w0", "partition": "0"}
    seen: list[float] = []

    async def lag() -> float:
        await worker.update_gauges()
        value = REGISTRY.get_sample_value("keyrange_consumer_lag", labels)
        assert value is not None
        seen.append(value)
        return value

    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(lambda: worker.slots[0].paused, what="partition 0 to pause for backpressure")
        # Nothing finishes behind the gate: the committable offset stays at 0, so the lag is the end.
        assert worker.slots[0].committable == 0
        await asyncio.to_thread(produce_stream, bootstrap, topic_name, WHILE_PAUSED, 1, 40, 0.0, False, 8)
        assert worker.slots[0].paused
        if broker_engine.engine == "kafka":
            await wait_until_async(lag, BEFORE + WHILE_PAUSED, "the lag to count the records produced "
                                   "while the partition was paused")
        else:
            await wait_until_async(lag, BEFORE, "the lag to count the records produced before the pause",
                                   at_least=True)
        assert worker.slots[0].paused
        gate.set()
        await wait_for(lambda: worker.stats.processed >= BEFORE + WHILE_PAUSED, what="every event")
        await wait_for(lambda: worker.slots[0].committable == BEFORE + WHILE_PAUSED,
                       what="every offset committable")
        await wait_until_async(lag, 0, "the lag to fall to 0")
    finally:
        gate.set()
        await worker.stop()
    # Never above the truth, on either broker.
    assert max(seen) <= BEFORE + WHILE_PAUSED
    log = read_input_log(bootstrap, topic_name, BEFORE + WHILE_PAUSED)
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", len(first_occurrences(log))),
              read_counts(bootstrap, topic_name, settings.group_id))


async def wait_until_async(value: Any, expected: float, what: str, at_least: bool = False,
                           timeout_seconds: float = 30.0) -> None:
    """Poll the coroutine function `value` until it returns `expected` (or more, with `at_least`)."""
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    last = None
    while asyncio.get_running_loop().time() < deadline:
        last = await value()
        if last == expected or (at_least and last >= expected):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}: lag {last}, expected {expected}")
