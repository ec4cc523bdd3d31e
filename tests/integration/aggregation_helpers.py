"""Producers and checks shared by the aggregation tests (their Spark session is a fixture in
conftest.py)."""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from keyrange.events import InputEvent, encode_processed
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.ranges.slots import partition_for_key


def require_pyspark() -> None:
    """Fail, never skip, without pyspark: the suite's install (`make install-dev`) provides it, so
    its absence is a broken set-up that a skip would hide."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"pyspark is missing ({exc}); run `make install-dev`, which installs keyrange[spark]",
                    pytrace=False)


@dataclass(frozen=True)
class Delivered:
    """A processed record as produced to the sink: where it landed and what it says."""

    partition: int
    value: dict[str, Any]


def make_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create the topic explicitly (tansu would auto-create it with 4 partitions)."""
    ensure_topics(bootstrap, [TopicSpec(topic, partitions)])


def transactional_producer(bootstrap: str) -> Producer:
    """A transactional producer like the workers' (so the topic has transaction markers)."""
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"test-{uuidlib.uuid4()}",
        "linger.ms": 5,
        "log_level": 3,
    })
    producer.init_transactions(30)
    return producer


def processed_records(count: int, clients: int, seed: int, start_ms: int = 1_790_000_000_000, first_offset: int = 0,
                      workers: Sequence[str] = ("worker-0", "worker-1", "worker-2")) -> list[dict[str, Any]]:
    """Processed-record values for a ledger consumer: `count` events over `clients` clients,
    spread over a few minutes, with made-up but plausible timings. Input offsets start at
    `first_offset` (give later batches of one stream higher ones, as a real input log would)."""
    rng = random.Random(seed)
    ledgers: dict[int, int] = {}
    out = []
    for i in range(count):
        client = 1000 + rng.randrange(clients)
        created = start_ms + i * 37 + rng.randrange(20)
        started = created + rng.randrange(0, 400)
        finished = started + rng.randrange(5, 30)
        if rng.random() < 0.1:
            returned, ledgers[client] = ledgers.get(client, 0), 0
        else:
            amount = rng.randrange(1, 10)
            ledgers[client] = returned = ledgers.get(client, 0) + amount
        event = InputEvent(client, str(uuidlib.UUID(int=rng.getrandbits(128))), created, {})
        _, value = encode_processed(event, client % 4, first_offset + i, rng.choice(list(workers)), started, finished,
                                    {"value": ledgers[client], "returned": returned})
        out.append(orjson.loads(value))
    return out


def with_text_ids(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with text clientIds, as under `spec.input` (docs/input.md): an even id becomes
    `user-<hex>` (or `kunde-ü<n>`), and an id divisible by 3 alternates between the integer and its
    decimal text, which the aggregation counts as one client, as their record keys are one."""
    out = []
    for i, record in enumerate(records):
        client = record["clientId"]
        if client % 2 == 0:
            client = f"user-{client:x}" if client % 4 else f"kunde-ü{client}"
        elif client % 3 == 0 and i % 2:
            client = str(client)
        out.append({**record, "clientId": client})
    return out


def produce_processed(bootstrap: str, topic: str, records: Sequence[dict[str, Any]], partitions: int,
                      per_transaction: int = 200, abort_every: int = 0) -> list[Delivered]:
    """Produce records keyed by clientId (partition = clientId mod partitions) in transactions.

    With `abort_every` = n, every n-th transaction also carries junk and is aborted, so the topic
    has aborted records that read_committed must hide. Returns what was committed.
    """
    producer = transactional_producer(bootstrap)
    delivered: list[Delivered] = []
    for n, first in enumerate(range(0, len(records), per_transaction), start=1):
        producer.begin_transaction()
        if abort_every and n % abort_every == 0:
            for j in range(20):
                producer.produce(topic, key=b"0", value=b'{"aborted": true}', partition=j % partitions)
            producer.abort_transaction(30)
            producer.begin_transaction()
        for record in records[first:first + per_transaction]:
            key = str(record["clientId"]).encode()
            partition = (record["clientId"] % partitions if isinstance(record["clientId"], int)
                         else partition_for_key(key, partitions))
            producer.produce(topic, key=key, value=orjson.dumps(record), partition=partition)
            delivered.append(Delivered(partition, record))
        producer.commit_transaction(30)
    return delivered
