"""One worker, two hash-range slots of one partition (ranges/layout.py), on Kafka and tansu: a slot
acquired while its partition streams for the other is handled from its own start, nothing lost or
run twice, though the partition was being fetched far ahead of that start."""

from __future__ import annotations

import asyncio

from keyrange.handlers import load_handler
from keyrange.ranges.layout import SlotLayout
from keyrange.worker import Worker
from keyrange.worker.totals import committed_totals, sum_totals
from tests.checkers import Counts, check_all
from tests.integration.worker_helpers import produce_stream, settings_for, wait_for
from tests.kafkatools import read_input_log, read_processed

EVENTS = 6_000


async def test_a_slot_acquired_mid_stream_beside_its_sibling_misses_nothing(any_bootstrap: str,
                                                                            topic_name: str) -> None:
    sent = await asyncio.to_thread(produce_stream, any_bootstrap, topic_name, EVENTS, partitions=1, ledger=True)
    log = await asyncio.to_thread(read_input_log, any_bootstrap, topic_name, sent)
    # Handled at a few thousand a second, so the fetch runs ahead of the handler while slot 1 joins.
    settings = settings_for(any_bootstrap, topic_name, handler_config={"delayMs": 2})
    worker = Worker(settings, load_handler("ledger", settings.handler_config))
    await worker.start()
    layout = SlotLayout(1, 2)
    worker.use_layout(layout)
    try:
        await worker.acquire([0])
        # The partition is fetched for slot 0 far past offset 0 when slot 1 joins from offset 0.
        await wait_for(lambda: worker.stats.consumed >= EVENTS // 4, what="slot 0 to be mid-stream")
        await worker.acquire([1])
        distinct = len({e.uuid for e in log})
        await wait_for(lambda: worker.stats.processed + worker.stats.duplicates >= sent, 120,
                       f"all {sent} records to finish ({distinct} distinct)")
    finally:
        await worker.stop()
    processed = await asyncio.to_thread(read_processed, any_bootstrap, f"{topic_name}.processed", distinct)
    totals = sum_totals(committed_totals(settings, [0], layout).values())
    check_all(log, list(processed), Counts(totals.handled, totals.dead_lettered, totals.duplicates_dropped),
              ledger=True)
