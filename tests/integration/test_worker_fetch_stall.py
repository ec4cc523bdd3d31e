"""A partition the consumer stopped fetching, the worker not told, is fetched afresh (stalls.py).

librdkafka's stuck fetch states (after a broker restart or a leader change) cannot be produced on
demand. The stand-in pauses the partition in the consumer the test gave the worker, behind the engine's back:
from then on the consumer fetches nothing of it while the engine believes it fetches, which is what
such a stall looks like from the worker.
"""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from keyrange.handlers import load_handler
from keyrange.worker import Worker, stalls
from keyrange.worker.consumer import ThreadedConsumer
from tests.checkers import check_all, first_occurrences
from tests.integration.worker_helpers import produce_stream, settings_for, wait_for
from tests.kafkatools import read_counts, read_input_log, read_processed

STALL_SECONDS = 2.0
"""Short, so the test does not wait the production 20 s."""


@pytest.fixture
def bootstrap(any_bootstrap: str) -> str:
    """Every test of this module runs on tansu and on Apache Kafka (tests/conftest.py's `broker_engine`)."""
    return any_bootstrap


async def test_a_partition_the_consumer_stopped_fetching_is_fetched_again(
        bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(stalls, "STALL_SECONDS", STALL_SECONDS)
    first = produce_stream(bootstrap, topic_name, 400, partitions=2, clients=40, duplicate_ratio=0.05, ledger=True)
    settings = settings_for(bootstrap, topic_name)
    consumer = ThreadedConsumer(settings)
    worker = Worker(settings, load_handler("ledger", {}), consumer=consumer)
    await worker.start()
    try:
        await worker.acquire([0, 1])
        log = read_input_log(bootstrap, topic_name, first)
        await wait_for(lambda: worker.stats.processed >= len(first_occurrences(log)), what="the first events")
        await consumer.pause([0])  # the stand-in for a stuck fetch state: see the module's docstring
        second = produce_stream(bootstrap, topic_name, 400, partitions=2, clients=40, duplicate_ratio=0.05,
                                ledger=True, seed=8)
        log = read_input_log(bootstrap, topic_name, first + second)
        with caplog.at_level(logging.WARNING, logger="keyrange.worker.engine"):
            await wait_for(lambda: worker.stats.processed >= len(first_occurrences(log)), timeout_seconds=60,
                           what="every event, partition 0's after its fetch was found stalled")
    finally:
        await worker.stop()
    stalled = [r.getMessage() for r in caplog.records if "fetched nothing past offset" in r.getMessage()]
    assert stalled and all(m.startswith("partition 0 ") for m in stalled), stalled
    counted = REGISTRY.get_sample_value("keyrange_fetch_stalls_total", {"consumer": settings.group_id, "worker": "w0"})
    assert counted == len(stalled)
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", len(first_occurrences(log))),
              read_counts(bootstrap, topic_name, settings.group_id, covering=len(log)), ledger=True)
