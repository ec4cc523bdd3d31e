"""The Spark aggregation's figures (issue 6, item 4), beside a plain-Python baseline.

- throughput: processed records/s aggregated by `run_once` in local[2] (after one warm-up read
  that starts Spark's Python workers; read through the
  keyrange-kafka source, deduplicated, three Parquet tables written), from a backlog of N
  records with 1 % re-deliveries; baseline: a confluent-kafka loop reading the same topic plus
  `keyrange.aggregation.reference.aggregate` (the same aggregates in plain Python, in memory).
- freshness: in continuous mode (trigger 1 s), from committing a burst of 1,000 processed
  records to their being counted in the newest Parquet tables (`read_results`), per burst.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
import uuid as uuidlib
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.harness import percentile, row
from keyrange.aggregation.reference import Delivery, aggregate
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.local.broker import EmbeddedBroker

PARTITIONS = 12
CLIENTS = 1000


class _Stream:
    """Processed records of a ledger consumer, as workers would write them (transactions of 1,000)."""

    def __init__(self, bootstrap: str, topic: str, seed: int = 7) -> None:
        self.topic = topic
        self.rng = random.Random(seed)
        self.offset = 0
        self.ledgers: dict[int, int] = {}
        self.sent: list[dict[str, Any]] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuidlib.uuid4()}",
                                  "linger.ms": 5, "log_level": 3})
        self.producer.init_transactions(30)

    def _record(self) -> dict[str, Any]:
        rng = self.rng
        client = 1000 + rng.randrange(CLIENTS)
        created = int(time.time() * 1000) - rng.randrange(200)
        started = created + rng.randrange(1, 50)
        amount = rng.randrange(1, 10)
        self.ledgers[client] = value = self.ledgers.get(client, 0) + amount
        self.offset += 1
        return {"clientId": client, "uuid": str(uuidlib.UUID(int=rng.getrandbits(128))), "created": created,
                "partition": client % PARTITIONS, "offset": self.offset, "worker": f"worker-{client % 3}",
                "startedAt": started, "finishedAt": started + 10 + rng.randrange(3),
                "result": {"value": value, "returned": value}}

    def send(self, count: int, redeliver_ratio: float = 0.01) -> int:
        """Produce `count` new records (plus re-deliveries); return how many records were written."""
        written = 0
        for first in range(0, count, 1000):
            self.producer.begin_transaction()
            for _ in range(min(1000, count - first)):
                batch = [self._record()]
                self.sent.append(batch[0])
                if self.rng.random() < redeliver_ratio:
                    batch.append(self.rng.choice(self.sent))
                for record in batch:
                    self.producer.produce(self.topic, key=str(record["clientId"]).encode(),
                                          value=orjson.dumps(record), partition=record["clientId"] % PARTITIONS)
                    written += 1
            self.producer.commit_transaction(60)
        return written


def _baseline_seconds(bootstrap: str, topic: str, expect: int) -> tuple[float, int]:
    """Read the topic with a plain consumer and aggregate in plain Python; (seconds, unique)."""
    began = time.monotonic()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed", "log_level": 3})
    deliveries = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 300
        while len(deliveries) < expect and time.monotonic() < deadline:
            for m in consumer.consume(10_000, 0.1):
                if m.error() is None:
                    deliveries.append(Delivery(m.partition(), m.offset(), m.value()))
    finally:
        consumer.close()
    result = aggregate(deliveries)
    return time.monotonic() - began, sum(c["events"] for c in result["clients"])


def _throughput(spark: Any, bootstrap: str, records: int) -> list[dict[str, Any]]:
    from keyrange.aggregation import run_once

    topic = "bench-throughput.processed"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)])
    stream = _Stream(bootstrap, topic)
    written = stream.send(records)
    # Warm-up, not measured: Spark's first Python tasks start their worker processes (seconds).
    spark.read.format("keyrange-kafka").option("bootstrap", bootstrap).option("topic", topic).load().count()
    with tempfile.TemporaryDirectory() as out:
        summary = run_once(bootstrap, topic, out, spark=spark)
    assert summary.aggregated == records, summary
    base_s, base_unique = _baseline_seconds(bootstrap, topic, written)
    assert base_unique == records
    rate, base_rate = written / summary.seconds, written / base_s
    return [
        row("aggregation records/s, local[2], run_once", rate, "records/s", None, base_rate,
            f"{written:,} records ({written - records:,} re-deliveries) in {summary.seconds:.1f} s, "
            f"{summary.batches} batch; baseline: consume + plain-Python aggregate in {base_s:.2f} s"),
    ]


def _freshness(spark: Any, bootstrap: str, bursts: int) -> list[dict[str, Any]]:
    from keyrange.aggregation import read_results, start_continuous

    topic = "bench-freshness.processed"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)])
    stream = _Stream(bootstrap, topic, seed=8)
    delays = []
    with tempfile.TemporaryDirectory() as out:
        running = start_continuous(bootstrap, topic, out, spark=spark, trigger_seconds=1.0)
        try:
            expected = 0
            for _ in range(bursts):
                time.sleep(random.uniform(0.5, 1.5))  # de-phase bursts from the trigger
                stream.send(1000, redeliver_ratio=0.0)
                committed = time.monotonic()
                expected += 1000
                deadline = committed + 300
                while sum(c["events"] for c in read_results(out).clients) < expected:
                    if running.query.exception() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"aggregates never reached {expected}: {running.query.exception()}")
                    time.sleep(0.05)
                delays.append(time.monotonic() - committed)
        finally:
            running.stop()
        batch_s = running.summary.batch_seconds
    note = (f"{bursts} bursts of 1,000 records; trigger 1 s; per micro-batch "
            f"p50 {percentile(batch_s, 0.5):.2f} s (max {max(batch_s):.2f} s)")
    return [
        row("aggregation freshness p50 (processed -> visible)", percentile(delays, 0.5), "s", "<= 10 s", None, note),
        row("aggregation freshness max", max(delays), "s", None, None, note),
    ]


def run(quick: bool) -> list[dict[str, Any]]:
    """Throughput and freshness rows."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from keyrange.aggregation.session import spark_session

    with EmbeddedBroker() as broker:
        began = time.monotonic()
        spark = spark_session("local[2]", app_name="keyrange-bench")
        startup = time.monotonic() - began
        try:
            rows = _throughput(spark, broker.bootstrap, 20_000 if quick else 200_000)
            rows += _freshness(spark, broker.bootstrap, 3 if quick else 10)
        finally:
            spark.stop()
    rows.append(row("Spark local[2] session start", startup, "s", None, None, "paid once per `keyrange aggregate`"))
    return rows
