"""How fast one-record batches are written to a one-partition topic, per producer setting.

    python -m benchmarks.batch_write_rate BOOTSTRAP [BATCHES]

A log of many small batches is what `test_worker_logreader`'s long-log test needs (tansu's fetch
answers came back empty for seconds inside such a log); writing it is most of that test's time.
Each setting writes BATCHES (default 4,000) records, one per batch, to a fresh topic of its own,
one setting after another in one run, and prints the batches written per second.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from confluent_kafka import Producer

from keyrange.kafkaio import TopicSpec, ensure_topics

FAST = {"max.in.flight.requests.per.connection": 50}
"""Not idempotent, so 50 requests in flight rather than 5 (what the long-log test writes with)."""
SETTINGS: list[tuple[str, dict[str, Any], int]] = [
    ("idempotent, 5 in flight", {"enable.idempotence": True}, 1),
    ("4 idempotent producers at once", {"enable.idempotence": True}, 4),
    ("not idempotent, 50 in flight", FAST, 1),
]
"""(name, producer settings, producers writing at once)."""


def one_record_batch_producer(bootstrap: str, settings: dict[str, Any]) -> Producer:
    """A producer that sends each record in a batch of its own."""
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, "log_level": 3,
                     **settings})


def append_one_record_batches(producer: Producer, topic: str, count: int,
                              stop: threading.Event | None = None) -> None:
    """Send `count` records of 100 bytes to partition 0 of `topic` (2 ms apart when `stop` is given,
    until it is set); the caller flushes."""
    for i in range(count):
        if stop is not None and stop.wait(0.002):
            break
        while True:
            try:
                producer.produce(topic, b"v" * 100, str(i).encode(), partition=0)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)


def write(bootstrap: str, topic: str, count: int, settings: dict[str, Any]) -> None:
    """`count` one-record batches to partition 0 of `topic`, delivered."""
    producer = one_record_batch_producer(bootstrap, settings)
    append_one_record_batches(producer, topic, count)
    left = producer.flush(120)
    if left:
        raise SystemExit(f"{left} records of {topic} were not delivered in 120 s")


def main(argv: list[str]) -> None:
    if not 1 <= len(argv) <= 2:
        raise SystemExit(__doc__)
    bootstrap, batches = argv[0], int(argv[1]) if len(argv) == 2 else 4000
    for name, settings, producers in SETTINGS:
        topic = f"batch-write-rate-{time.time_ns()}"
        ensure_topics(bootstrap, [TopicSpec(topic, 1)])
        began = time.monotonic()
        threads = [threading.Thread(target=write, args=(bootstrap, topic, batches // producers, settings))
                   for _ in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(f"{name}: {batches / (time.monotonic() - began):.0f} batches/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
