"""Producer mistakes that weaken guarantees silently are counted and named, and dedup survives them."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from keyrange.events import encode_input
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.ranges.slots import partition_for_client
from tests.checkers import check_all
from tests.integration.worker_helpers import run_worker_until, settings_for
from tests.kafkatools import read_counts, read_input_log, read_processed


def sample(name: str, group: str, partition: int, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"consumer": group, "worker": "w0", "partition": str(partition),
                                            **labels}) or 0.0


async def test_events_on_the_wrong_partition_are_counted_and_warned_once(
        bootstrap: str, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    ensure_topics(bootstrap, [TopicSpec(topic_name, 4)])
    producer = Producer({"bootstrap.servers": bootstrap})
    now = int(time.time() * 1000)
    clients = [c for c in range(1000, 1100) if partition_for_client(c, 4) != 0][:5]
    for i in range(20):  # every client's events forced onto partition 0: 4 of every 5 are misplaced there
        client = clients[i % 5] if i % 5 else next(c for c in range(1000, 1100) if partition_for_client(c, 4) == 0)
        key, value = encode_input(client, f"e{i}", now)
        producer.produce(topic_name, value, key, partition=0, timestamp=now)
    assert producer.flush(30) == 0
    log = read_input_log(bootstrap, topic_name, 20)
    settings = settings_for(bootstrap, topic_name)
    with caplog.at_level(logging.WARNING, logger="keyrange.worker.intake"):
        await run_worker_until(settings, "noop", [0, 1, 2, 3], lambda w: w.stats.processed >= 20)
    assert sample("keyrange_misplaced_events_total", settings.group_id, 0) == 16
    warnings = [r.getMessage() for r in caplog.records if "murmur2" in r.getMessage()]
    assert len(warnings) == 1 and "partition 0 holds events of client" in warnings[0]
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 20), read_counts(bootstrap, topic_name,
                                                                                          settings.group_id))


async def test_skewed_clocks_are_counted_and_their_duplicates_still_dropped(bootstrap: str, topic_name: str) -> None:
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    producer = Producer({"bootstrap.servers": bootstrap})
    now = int(time.time() * 1000)
    # On time, an hour ahead, an hour behind: each sent twice, one right after the other.
    events = [("on-time", now), ("ahead", now + 3_600_000), ("behind", now - 3_600_000)]
    for uuid, created in events:
        for _ in range(2):
            key, value = encode_input(1000, uuid, created)
            producer.produce(topic_name, value, key, partition=0, timestamp=now)
    for i in range(50):  # a steady stream after the skewed ones: the window must keep working
        key, value = encode_input(1000 + i % 7, f"later-{i}", now + i)
        producer.produce(topic_name, value, key, partition=0, timestamp=now + i)
    assert producer.flush(30) == 0
    log = read_input_log(bootstrap, topic_name, 56)
    settings = settings_for(bootstrap, topic_name)
    worker = await run_worker_until(settings, "noop", [0], lambda w: w.stats.consumed >= 56 and w.stats.pending == 0)
    assert sample("keyrange_clock_skewed_events_total", settings.group_id, 0, direction="ahead") == 2
    assert sample("keyrange_clock_skewed_events_total", settings.group_id, 0, direction="behind") == 2
    assert worker.stats.duplicates == 3
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 53),
              read_counts(bootstrap, topic_name, settings.group_id, covering=56))
