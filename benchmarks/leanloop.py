"""The lean reference of the ledger benchmark: the worker's per-event work in one plain loop.

What `keyrange worker --handler ledger` does per event, without the engine around it (issue 27,
item 7): the same parse (`events.parse_input`: orjson and the wire checks), the same TTL dedup
window per partition (`worker.dedup.TtlSet`, in event time), the ledger's counter update, the same
processed record (`events.encode_processed`, with the group and state headers), one changelog
record per changed client and a totals record per partition per commit, and a transactional
commit of all of it with the input offsets every `commit_interval_ms`, read_committed. It leaves
out only the engine's structure: per-client scheduling, the commit window, attempts, staging, the
handler context, metrics, and one producer per slot (here one producer for every partition).
Events of a partition are handled in log order, so its committable offset is the last one + 1.

The gap between this loop and the worker, measured side by side in `bench_ledger`, is what the
engine's structure costs per event; the gap to `rawloop` is what the work itself costs.

    python -m benchmarks.leanloop --bootstrap HOST:PORT --topic T --output T.lean --group G \
        --partitions 12 [--commit-interval-ms 100]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.rawloop import serve
from keyrange.events import (
    GROUP_HEADER,
    SOURCE_OFFSET_HEADER,
    STATE_HEADER,
    TOTALS_KEY,
    BadEvent,
    encode_processed,
    encode_totals,
    json_bytes,
    parse_input,
)
from keyrange.kafkaclients import KafkaClients
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker.dedup import TtlSet

TTL_SECONDS = 300.0
"""The worker's default dedup TTL."""


def run_loop(bootstrap: str, topic: str, output: str, group: str, partitions: int, transactional: bool,
             commit_interval_ms: int, stop: list[bool]) -> int:
    """Handle `topic` from the group's committed offsets (else the start) as the ledger worker
    would, writing to `output` and `output`.state; return the events handled once `stop[0]`."""
    del transactional  # always transactional, as the worker is
    state_topic = f"{output}.state"
    ensure_topics(bootstrap, [TopicSpec(state_topic, partitions)], timeout_seconds=60)
    clients = KafkaClients(bootstrap)
    # The worker's consumer and producer tuning (consumer.py, transactions.py).
    consumer = Consumer(clients.consumer(group, {"fetch.wait.max.ms": 20}))
    producer = Producer(clients.transactional_producer(f"lean-{group}", 60_000, {"linger.ms": 5}))
    producer.init_transactions(30)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    committed = consumer.committed(tps, timeout=30)
    consumer.assign([TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else 0) for tp in committed])
    group_header = (GROUP_HEADER, group.encode())
    dedup = [TtlSet(TTL_SECONDS, time.time) for _ in range(partitions)]
    counters: dict[Any, int] = {}
    dirty: list[dict[Any, tuple[bytes, int]]] = [{} for _ in range(partitions)]
    totals = [[0, 0, 0] for _ in range(partitions)]
    positions: dict[int, int] = {}
    handled = 0
    interval = commit_interval_ms / 1000
    next_commit = time.monotonic() + interval
    in_transaction = False
    produce = producer.produce
    try:
        while not stop[0]:
            batch = consumer.consume(1000, 0) or consumer.consume(1, 0.05)
            if batch and not in_transaction:
                producer.begin_transaction()
                in_transaction = True
            for m in batch:
                if m.error() is not None:
                    continue
                partition: int = m.partition()  # type: ignore[assignment]
                offset: int = m.offset()  # type: ignore[assignment]
                positions[partition] = offset + 1
                try:
                    event = parse_input(m.value())
                except BadEvent:
                    totals[partition][1] += 1  # the worker dead-letters it; not in this load
                    continue
                if not dedup[partition].add_if_new(event.uuid, (event.created_ms or m.timestamp()[1]) / 1000):  # type: ignore[arg-type]
                    totals[partition][2] += 1
                    continue
                client, body = event.client_id, event.body
                counter = counters.get(client, 0)
                if body.get("op") == "drain":
                    returned, counter = counter, 0
                else:
                    counter = returned = counter + int(body["amount"])
                counters[client] = counter
                state = json_bytes(counter)
                dirty[partition][client] = (state, offset)
                now_ms = int(time.time() * 1000)
                key, value = encode_processed(event, partition, offset, group, now_ms, now_ms,
                                              {"value": counter, "returned": returned})
                while True:
                    try:
                        produce(output, value, key, partition=partition,
                                headers=[group_header, (STATE_HEADER, state)])
                        break
                    except BufferError:  # librdkafka's queue is full: let deliveries drain it
                        producer.poll(0.05)
                totals[partition][0] += 1
                handled += 1
            producer.poll(0)
            if time.monotonic() >= next_commit and positions:
                for p, committable in positions.items():
                    for client, (state, offset) in dirty[p].items():
                        produce(state_topic, state, str(client).encode(), partition=p,
                                headers=[(SOURCE_OFFSET_HEADER, str(offset).encode())])
                    dirty[p] = {}
                    produce(state_topic, encode_totals(*totals[p]), TOTALS_KEY, partition=p,
                            headers=[(SOURCE_OFFSET_HEADER, str(committable).encode())])
                offsets = [TopicPartition(topic, p, o) for p, o in positions.items()]
                producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
                producer.commit_transaction(30)
                in_transaction = False
                positions.clear()
                next_commit = time.monotonic() + interval
    finally:
        if in_transaction:
            producer.abort_transaction(30)
        producer.flush(30)
        consumer.close()
    return handled


if __name__ == "__main__":
    sys.exit(serve(run_loop, "python -m benchmarks.leanloop", __doc__))
