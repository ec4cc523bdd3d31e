"""Test helpers that read topics back from the broker."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from keyrange.events import decode_processed
from tests.checkers import LoggedEvent


def read_topic(bootstrap: str, topic: str, expect: int | None = None, idle_seconds: float = 2.0,
               timeout_seconds: float = 60.0) -> list[Any]:
    """Every record of `topic` from the beginning (read_committed), as confluent Messages.

    Stops when `expect` records were read, or after `idle_seconds` with nothing new.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"test-reader-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "log_level": 3,
    })
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        parts = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_seconds
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            batch = [m for m in consumer.consume(1000, 0.2) if m.error() is None]
            if batch:
                out.extend(batch)
                last_new = time.monotonic()
            if expect is not None and len(out) >= expect:
                break
            if time.monotonic() - last_new > idle_seconds and (expect is None or len(out) >= expect):
                break
        return out
    finally:
        consumer.close()


def read_input_log(bootstrap: str, topic: str, expect: int | None = None) -> list[LoggedEvent]:
    """The input topic as LoggedEvents (partition, offset, clientId, uuid, body)."""
    import orjson

    events = []
    for m in read_topic(bootstrap, topic, expect):
        body = orjson.loads(m.value())
        events.append(LoggedEvent(m.partition(), m.offset(), body["clientId"], body["uuid"], body))
    return events


def read_processed(bootstrap: str, topic: str, expect: int | None = None,
                   timeout_seconds: float = 60.0) -> list[Mapping[str, Any]]:
    """The processed records of a sink topic, decoded."""
    return [decode_processed(m.value()) for m in read_topic(bootstrap, topic, expect,
                                                            timeout_seconds=timeout_seconds)]
