"""One measurement of bench_hash_range's skip cost, in a process of its own.

    python -m benchmarks.skipdrain drain BOOTSTRAP TOPIC READERS GROUP OWN
    python -m benchmarks.skipdrain raw BOOTSTRAP TOPIC EXPECT

`drain`: a worker holding slot 0 of READERS hash ranges of the 1-partition TOPIC drains its
backlog until it handled OWN records (and skipped the others'); prints the CPU seconds of the
whole process (every thread, librdkafka's included) and the wall seconds, from after the acquire.
`raw`: a plain confluent-kafka loop reads EXPECT records of TOPIC, each record's key and offset;
prints its CPU seconds per record, the floor any reader of the partition pays.

A fresh process per measurement counts no thread left by an earlier one, and may import keyrange
from another checkout (bench_hash_range's `--before`): this module uses only what every version
of the worker has since hash ranges exist.
"""

from __future__ import annotations

import asyncio
import sys
import time

from confluent_kafka import Consumer, TopicPartition

from keyrange.handlers import load_handler
from keyrange.ranges.layout import SlotLayout
from keyrange.worker import Worker, WorkerSettings


async def drain_one_slot(bootstrap: str, topic: str, readers: int, group: str, own: int) -> tuple[float, float]:
    """(CPU s, wall s) of a worker holding slot 0 of `readers` hash ranges of partition 0 of `topic`
    while it handles its `own` records of the backlog (and skips the rest)."""
    settings = WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=group, worker_id=group,
                              commit_interval_ms=100, concurrency=64)
    worker = Worker(settings, load_handler("noop", {}))
    await worker.start()
    try:
        worker.use_layout(SlotLayout(1, readers))
        await worker.acquire([0])
        cpu, wall = time.process_time(), time.monotonic()
        while worker.stats.processed < own:
            await asyncio.sleep(0.01)
        return time.process_time() - cpu, time.monotonic() - wall
    finally:
        await worker.stop()


def raw_consume_cpu(bootstrap: str, topic: str, expect: int) -> float:
    """CPU s per record of a plain confluent-kafka loop reading `expect` records of `topic` from the
    start (read_committed, reading each record's key and offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed", "log_level": 3})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        began = None
        deadline = time.monotonic() + 120
        while seen < expect and time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.1)
            if batch and began is None:
                began = time.process_time()
            for m in batch:
                if m.error() is None:
                    m.key()
                    m.offset()
                    seen += 1
        return (time.process_time() - began) / seen if began is not None and seen else 0.0
    finally:
        consumer.close()


def main(argv: list[str]) -> None:
    """Run the measurement `argv` names (module docstring) and print its figures."""
    if argv[0] == "drain":
        bootstrap, topic, readers, group, own = argv[1:]
        cpu, wall = asyncio.run(drain_one_slot(bootstrap, topic, int(readers), group, int(own)))
        print(cpu, wall)
    elif argv[0] == "raw":
        bootstrap, topic, expect = argv[1:]
        print(raw_consume_cpu(bootstrap, topic, int(expect)))
    else:
        raise SystemExit(f"unknown measurement {argv[0]!r}: drain or raw")


if __name__ == "__main__":
    main(sys.argv[1:])
