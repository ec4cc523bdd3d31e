"""A slot given back to a worker that held it before: nothing of the earlier holding may linger.

The regression behind the lost tail after a merge: a worker released a slot while it was paused
for backpressure, the slot came back to it later, and librdkafka still had the partition paused
(it keeps the pause flag across `incremental_unassign` / `incremental_assign`). The engine, with a
fresh partition state, believed it was fetching; nothing arrived, and the stale cached high
watermark made the lag read 0, so the planner merged on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from keyrange.handlers import Handler
from keyrange.worker import Worker
from tests.checkers import check_all, first_occurrences
from tests.integration.worker_helpers import produce_stream, settings_for, wait_for
from tests.kafkatools import read_input_log, read_processed


async def test_a_slot_released_while_paused_fetches_again_when_it_comes_back(bootstrap: str, topic_name: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 600, partitions=1, clients=40, duplicate_ratio=0.0)
    log = read_input_log(bootstrap, topic_name, sent)
    gate = asyncio.Event()

    async def gated(event: dict[str, Any], ctx: Any) -> None:
        await gate.wait()

    settings = settings_for(bootstrap, topic_name, concurrency=4, max_pending=20, fetch_batch_size=10)
    worker = Worker(settings, Handler("gated", gated, True))
    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(lambda: worker._partitions[0].paused, what="partition 0 to pause for backpressure")
        release = asyncio.ensure_future(worker.release([0]))
        await wait_for(lambda: worker._partitions.get(0) is None or worker._partitions[0].revoked,
                       what="the release to revoke the slot")
        gate.set()  # the in-flight calls finish, the release commits them
        await release
        assert worker.held_slots == frozenset()
        await worker.acquire([0])
        await wait_for(lambda: worker.stats.processed >= sent, timeout_seconds=60,
                       what="every event after the slot came back (it stayed paused in librdkafka)")
    finally:
        gate.set()
        await worker.stop()
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", len(first_occurrences(log))))

