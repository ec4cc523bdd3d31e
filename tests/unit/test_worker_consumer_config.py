"""The worker consumer's prefetch settings that backpressure depends on (no Kafka).

The throughput they buy is measured by the hot-counter benchmark (BENCHMARKS.md); these checks
keep the settings from drifting back to librdkafka's defaults unnoticed."""

from __future__ import annotations

from keyrange.worker.consumer import consumer_config
from keyrange.worker.settings import WorkerSettings

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="2")


def test_a_partition_resumed_after_backpressure_fetches_again_within_a_few_handler_calls() -> None:
    # Pausing drops the partition's prefetched records, and librdkafka's default waits 1000 ms
    # before refilling a queue that was full: a hot partition then sat idle after every resume.
    for role in ("fetch", "restore"):
        assert consumer_config(SETTINGS, role)["fetch.queue.backoff.ms"] <= 20


def test_the_users_own_prefetch_backoff_wins() -> None:
    settings = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="2",
                              client_properties={"fetch.queue.backoff.ms": "250"})
    assert consumer_config(settings)["fetch.queue.backoff.ms"] == "250"
