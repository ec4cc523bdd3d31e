"""The baseline of the ledger benchmarks: a raw confluent-kafka consume-and-produce loop.

What a hand-written ledger consumer does with none of keyrange's machinery: read a batch, keep a
counter per client in a dict, write one result record per command (keyed by client, to the same
partition of the output topic), commit the input offsets. No dedup, no per-client ordering beyond
the partition's, no retries, no dead letters, no state changelog, no restore.

Two modes:
- transactional (the fair comparison): the results and the input offsets commit in one Kafka
  transaction every `commit_interval_ms`, as keyrange's worker does, so a read_committed reader
  sees each result once;
- plain: results produced idempotently, offsets committed asynchronously at the same interval
  (at-least-once: a crash re-runs and re-writes what came after the last commit).

Runs in its own process, like a `keyrange worker`, until stopped (SIGTERM/SIGINT):

    python -m benchmarks.rawloop --bootstrap HOST:PORT --topic T --output T.raw --group G \
        --partitions 12 [--transactional] [--commit-interval-ms 100]
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.kafkaclients import KafkaClients


def run_loop(bootstrap: str, topic: str, output: str, group: str, partitions: int, transactional: bool,
             commit_interval_ms: int, stop: list[bool]) -> int:
    """Consume `topic` from the group's committed offsets (else the start), write one result per
    command to `output`, commit; return the records handled when `stop[0]` becomes true."""
    clients = KafkaClients(bootstrap)
    # The worker's consumer and producer tuning (consumer.py, transactions.py), so only the
    # loop around them differs.
    consumer = Consumer(clients.consumer(group, {"fetch.wait.max.ms": 20}))
    if transactional:
        producer = Producer(clients.transactional_producer(f"raw-{group}", 60_000, {"linger.ms": 5}))
        producer.init_transactions(30)
    else:
        producer = Producer(clients.producer({"linger.ms": 5}))
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    committed = consumer.committed(tps, timeout=30)
    consumer.assign([TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else 0) for tp in committed])
    counters: dict[Any, int] = {}
    positions: dict[int, int] = {}
    handled = 0
    interval = commit_interval_ms / 1000
    next_commit = time.monotonic() + interval
    in_transaction = False
    produce, loads, dumps = producer.produce, orjson.loads, orjson.dumps
    try:
        while not stop[0]:
            batch = consumer.consume(1000, 0) or consumer.consume(1, 0.05)
            if batch and transactional and not in_transaction:
                producer.begin_transaction()
                in_transaction = True
            for m in batch:
                if m.error() is not None:
                    continue
                event = loads(m.value())
                client = event.get("clientId")
                if event.get("op") == "drain":
                    returned, value = counters.get(client, 0), 0
                else:
                    value = returned = counters.get(client, 0) + int(event.get("amount", 1))
                counters[client] = value
                partition: int = m.partition()  # type: ignore[assignment]
                result = dumps({"uuid": event.get("uuid"), "clientId": client, "created": event.get("created"),
                                "value": value, "returned": returned})
                while True:
                    try:
                        produce(output, result, m.key(), partition=partition)
                        break
                    except BufferError:  # librdkafka's queue is full: let deliveries drain it
                        producer.poll(0.05)
                positions[partition] = m.offset() + 1  # type: ignore[operator]
                handled += 1
            producer.poll(0)
            if time.monotonic() >= next_commit and positions:
                offsets = [TopicPartition(topic, p, o) for p, o in positions.items()]
                if transactional:
                    if in_transaction:
                        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
                        producer.commit_transaction(30)
                        in_transaction = False
                else:
                    consumer.commit(offsets=offsets, asynchronous=True)
                positions.clear()
                next_commit = time.monotonic() + interval
    finally:
        if transactional and in_transaction:
            producer.abort_transaction(30)
        producer.flush(30)
        consumer.close()
    return handled


Loop = Callable[[str, str, str, str, int, bool, int, list[bool]], int]
"""A benchmark loop: `run_loop`'s arguments, run until `stop[0]`; returns the records handled."""


def serve(loop: Loop, prog: str, description: str | None, argv: list[str] | None = None) -> int:
    """Run `loop` (this module's, or the lean loop's) with the command line's arguments until
    SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--transactional", action="store_true")
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    args = parser.parse_args(argv)
    stop = [False]

    def on_signal(_sig: int, _frame: Any) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    loop(args.bootstrap, args.topic, args.output, args.group, args.partitions, args.transactional,
         args.commit_interval_ms, stop)
    return 0


if __name__ == "__main__":
    sys.exit(serve(run_loop, "python -m benchmarks.rawloop", __doc__))
