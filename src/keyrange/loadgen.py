"""The kata's stream as a load generator (`keyrange produce`).

Events arrive at a steady rate from a fixed set of clients (ids 1000..1099 by default, a few
events/s each at 1000/s), each with a fresh uuid4; a small share is sent again 10 ms to 5 s
later with the same uuid, as an at-least-once upstream would. The schedule is computed in
virtual time (event i is due at i / rate), so tests can produce the very same stream unpaced.
"""

from __future__ import annotations

import heapq
import random
import sys
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from confluent_kafka import KafkaException, Producer

from keyrange.events import encode_input
from keyrange.kafkaclients import KafkaClients
from keyrange.kafkaio import TopicSpec, ensure_topics

DUPLICATE_DELAY_MIN_S = 0.010
DUPLICATE_DELAY_MAX_S = 5.0


@dataclass(frozen=True)
class LoadShape:
    """What to generate."""

    rate: float = 1000.0
    """Events per second (first sends; duplicates come on top)."""
    clients: int = 100
    """Number of distinct clients."""
    first_client_id: int = 1000
    """Client ids are first_client_id .. first_client_id + clients - 1."""
    duplicate_ratio: float = 0.01
    """Share of events sent a second time, 10 ms to 5 s later."""
    ledger: bool = False
    """Emit ledger commands (`op`: increment | drain, `amount`) instead of plain events."""
    drain_ratio: float = 0.1
    """With `ledger`: share of commands that are drains."""
    seed: int | None = None
    """Random seed, for reproducible streams."""

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.clients < 1:
            raise ValueError(f"clients must be at least 1, got {self.clients}")
        if not 0 <= self.duplicate_ratio <= 1:
            raise ValueError(f"duplicate ratio must be between 0 and 1, got {self.duplicate_ratio}")


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One record to send at virtual time `due_s` (seconds from the start)."""

    due_s: float
    key: bytes
    value: bytes
    created_ms: int
    duplicate: bool


def generate(shape: LoadShape, count: int | None = None, duration_s: float | None = None,
             clock_ms: Callable[[], int] | None = None) -> Iterator[Scheduled]:
    """Yield the stream in send order until `count` first sends or `duration_s` of virtual time.

    `created` is taken from `clock_ms` (wall clock by default) when an event is first generated;
    a duplicate repeats its original's bytes exactly.
    """
    if count is None and duration_s is None:
        raise ValueError("give a count or a duration")
    rng = random.Random(shape.seed)
    now_ms = clock_ms or (lambda: int(time.time() * 1000))
    pending: list[tuple[float, int, bytes, bytes, int]] = []
    tie = 0
    i = 0
    while True:
        due = i / shape.rate
        done = (count is not None and i >= count) or (duration_s is not None and due >= duration_s)
        while pending and (done or pending[0][0] <= due):
            d_due, _, d_key, d_value, d_created = heapq.heappop(pending)
            yield Scheduled(d_due, d_key, d_value, d_created, True)
        if done:
            return
        client = shape.first_client_id + rng.randrange(shape.clients)
        extra: dict[str, Any] = {}
        if shape.ledger:
            if rng.random() < shape.drain_ratio:
                extra = {"op": "drain"}
            else:
                extra = {"op": "increment", "amount": rng.randint(1, 100)}
        event_id = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        created = now_ms()
        key, value = encode_input(client, event_id, created, **extra)
        yield Scheduled(due, key, value, created, False)
        if rng.random() < shape.duplicate_ratio:
            delay = rng.uniform(DUPLICATE_DELAY_MIN_S, DUPLICATE_DELAY_MAX_S)
            tie += 1
            heapq.heappush(pending, (due + delay, tie, key, value, created))
        i += 1


def make_producer(bootstrap: str, client_properties: Mapping[str, str] | None = None, **tuning: Any) -> Producer:
    """A producer that places keys like Java clients do (murmur2), batching lightly."""
    return Producer(KafkaClients(bootstrap, client_properties or {}).producer({"linger.ms": 2, **tuning}))


def _produce(producer: Producer, topic: str, record: Scheduled, on_delivery: Any = None) -> None:
    # Record timestamp = created (wire contract), so time-based lookups follow event time.
    while True:
        try:
            producer.produce(topic, record.value, record.key, timestamp=record.created_ms,
                             on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)


def produce_all(bootstrap: str, topic: str, records: list[Scheduled],
                client_properties: Mapping[str, str] | None = None) -> int:
    """Send pre-generated records as fast as possible, in order; return how many were acked."""
    producer = make_producer(bootstrap, client_properties, **{"linger.ms": 20})
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for r in records:
        _produce(producer, topic, r, on_delivery)
    remaining = producer.flush(60)
    if remaining or errors:
        raise KafkaException(f"{remaining} records not delivered, {len(errors)} failed: {errors[:3]}")
    return len(records)


def run_paced(bootstrap: str, topic: str, shape: LoadShape, count: int | None, duration_s: float | None,
              partitions: int = 12, progress: TextIO | None = sys.stderr,
              client_properties: Mapping[str, str] | None = None) -> dict[str, int]:
    """Produce the stream paced in real time with a progress line; return totals."""
    ensure_topics(bootstrap, [TopicSpec(topic, partitions)], client_properties=client_properties)
    producer = make_producer(bootstrap, client_properties)
    start = time.monotonic()
    last_report = start
    sent = duplicates = 0
    paced = (0, 0.0)
    """(sends, seconds) up to the last new event: the rate the stream was offered at, before the
    tail of late duplicates (up to DUPLICATE_DELAY_MAX_S) that follows it."""
    jitter = random.Random(shape.seed)
    try:
        for record in generate(shape, count, duration_s):
            # A little jitter around the even schedule, as real producers have.
            target = start + record.due_s + jitter.uniform(-0.0005, 0.0005)
            delay = target - time.monotonic()
            if delay > 0:
                producer.poll(0)
                time.sleep(delay)
            _produce(producer, topic, record)
            sent += 1
            duplicates += record.duplicate
            now = time.monotonic()
            if not record.duplicate:
                paced = (sent, now - start)
            if progress is not None and now - last_report >= 1.0:
                last_report = now
                progress.write(
                    f"\rproduced {sent:,} events ({duplicates:,} duplicates) "
                    f"in {now - start:,.0f} s, {sent / (now - start):,.0f}/s   "
                )
                progress.flush()
    finally:
        producer.flush(30)
        if progress is not None:
            elapsed = max(time.monotonic() - start, 1e-9)
            paced_sent, paced_seconds = paced
            progress.write(
                f"\rproduced {sent:,} events ({duplicates:,} duplicates) in {elapsed:,.1f} s: "
                f"{paced_sent / max(paced_seconds, 1e-9):,.0f}/s over the {paced_seconds:,.1f} s of new events, "
                f"then {elapsed - paced_seconds:,.1f} s of late duplicates\n"
            )
    return {"sent": sent, "duplicates": duplicates}
