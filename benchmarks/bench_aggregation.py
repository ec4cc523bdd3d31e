"""The Spark aggregation's figures, in one run on Apache Kafka, beside a plain-Python baseline.

One topic of processed records (12 partitions, 1,000 clients, 1 % re-delivered, written in
transactions of 1,000 like the workers'), 1,000,000 of them (`--quick`: 100,000), `created`
advancing at 1,000 events/s of event time (the backlog of a stream at the kata's rate, ~17 minutes).
Over that same topic:
- baseline: a confluent-kafka loop (read_committed) plus `keyrange.aggregation.reference.aggregate`,
  the same aggregates in plain Python, in memory;
- `run_once` in local[2] reading with Spark's own Kafka connector (`--source kafka`), from an empty
  output and checkpoint: read, deduplicate by uuid, write the records and three Parquet tables;
- `run_once` reading with keyrange's Python data source (`--source keyrange-kafka`), the reader the
  job used before the connector, on the same topic;
- the connector's `run_once` again, from an empty output, in the same session (the JVM's JIT warm);
- freshness in continuous mode (connector, trigger 1 s, then the default 5 s): from committing a
  burst of 1,000 processed records, at a random phase of the trigger, to their being counted in
  the newest Parquet tables (`read_results`).
Records/s count the records read (re-deliveries included) over the run's wall time, Spark's
session start and a warm-up run per reader on another topic excluded (the session start has its
own row).
"""

from __future__ import annotations

import os
import random
import resource
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.harness import percentile, row
from keyrange.aggregation.processed_stream import DEFAULT_TRIGGER_SECONDS
from keyrange.aggregation.reference import Delivery, aggregate
from keyrange.kafkaio import TopicSpec, ensure_topics

PARTITIONS = 12
CLIENTS = 1000
EVENTS_PER_SECOND = 1000
"""Event-time rate of the backlog's `created` (the kata's ~1000 events/s)."""


class _Stream:
    """Processed records of a ledger consumer, as workers would write them (transactions of 1,000)."""

    def __init__(self, bootstrap: str, topic: str, seed: int = 7, backlog: int = 0) -> None:
        self.topic = topic
        self.rng = random.Random(seed)
        self.offset = 0
        self.ledgers: dict[int, int] = {}
        self.sent: list[dict[str, Any]] = []
        # A backlog's events were created over the past backlog / rate seconds, in order.
        self.clock_ms = int(time.time() * 1000) - backlog * 1000 // EVENTS_PER_SECOND
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuidlib.uuid4()}",
                                  "linger.ms": 5, "log_level": 3})
        self.producer.init_transactions(30)

    def _record(self, created: int) -> dict[str, Any]:
        rng = self.rng
        client = 1000 + rng.randrange(CLIENTS)
        started = created + rng.randrange(1, 50)
        amount = rng.randrange(1, 10)
        self.ledgers[client] = value = self.ledgers.get(client, 0) + amount
        self.offset += 1
        return {"clientId": client, "uuid": str(uuidlib.UUID(int=rng.getrandbits(128))), "created": created,
                "partition": client % PARTITIONS, "offset": self.offset, "worker": f"worker-{client % 3}",
                "startedAt": started, "finishedAt": started + 10 + rng.randrange(3),
                "result": {"value": value, "returned": value}}

    def send(self, count: int, redeliver_ratio: float = 0.01, now: bool = False) -> int:
        """Produce `count` new records (plus re-deliveries); return how many records were written.

        `now`: created at the current time (a live burst) instead of on the backlog's clock."""
        written = 0
        for first in range(0, count, 1000):
            self.producer.begin_transaction()
            for _ in range(min(1000, count - first)):
                if now:
                    created = int(time.time() * 1000) - self.rng.randrange(200)
                else:
                    self.clock_ms += 1000 // EVENTS_PER_SECOND
                    created = self.clock_ms
                batch = [self._record(created)]
                self.sent.append(batch[0])
                if self.rng.random() < redeliver_ratio:
                    batch.append(self.rng.choice(self.sent))
                for record in batch:
                    self.producer.produce(self.topic, key=str(record["clientId"]).encode(),
                                          value=orjson.dumps(record), partition=record["clientId"] % PARTITIONS)
                    written += 1
            self.producer.commit_transaction(60)
        return written


def _baseline(bootstrap: str, topic: str, expect: int) -> tuple[float, int]:
    """Read the topic with a plain consumer and aggregate in plain Python; (seconds, unique)."""
    began = time.monotonic()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed", "log_level": 3})
    deliveries = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 600
        while len(deliveries) < expect and time.monotonic() < deadline:
            for m in consumer.consume(10_000, 0.1):
                if m.error() is None:
                    deliveries.append(Delivery(m.partition(), m.offset(), m.value()))
    finally:
        consumer.close()
    result = aggregate(deliveries)
    return time.monotonic() - began, sum(c["events"] for c in result["clients"])


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _jvm_cpu_seconds(spark: Any) -> float:
    """CPU seconds of Spark's JVM so far (in local mode the driver and the executor; all threads:
    tasks, JIT compiler, garbage collector)."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _throughput(spark: Any, bootstrap: str, records: int) -> list[dict[str, Any]]:
    from keyrange.aggregation import run_once
    from keyrange.aggregation.processed_stream import CONNECTOR, PYTHON_SOURCE

    topic = "bench-throughput.processed"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)])
    written = _Stream(bootstrap, topic, backlog=records).send(records)
    base_load, base_cpu = os.getloadavg()[0], _own_cpu_seconds()
    base_s, base_unique = _baseline(bootstrap, topic, written)
    base_cpu = _own_cpu_seconds() - base_cpu
    assert base_unique == records, base_unique
    base_rate = written / base_s
    # Warm-up, not measured: a first run pays the JVM's JIT for the whole job, and keyrange-kafka's
    # the start of Spark's Python worker processes; without it the first reader measured loses.
    ensure_topics(bootstrap, [TopicSpec(f"{topic}-warm-up", PARTITIONS)])
    _Stream(bootstrap, f"{topic}-warm-up", seed=9, backlog=20_000).send(20_000)
    for source in (CONNECTOR, PYTHON_SOURCE):
        with tempfile.TemporaryDirectory() as out:
            run_once(bootstrap, f"{topic}-warm-up", out, spark=spark, source=source)
    rows = []
    # The connector once more at the end: its first run over a million records still pays the
    # JIT compiling the hot paths at that volume (the warm-up's 20,000 records do not get there),
    # which a long-running continuous job pays once.
    for source, label in ((CONNECTOR, "Spark's Kafka connector"), (PYTHON_SOURCE, "keyrange-kafka (before)"),
                          (CONNECTOR, "Spark's Kafka connector, run again (JIT warm)")):
        load_before, jvm_cpu, own_cpu = os.getloadavg()[0], _jvm_cpu_seconds(spark), _own_cpu_seconds()
        with tempfile.TemporaryDirectory() as out:
            summary = run_once(bootstrap, topic, out, spark=spark, source=source)
        jvm_cpu, own_cpu = _jvm_cpu_seconds(spark) - jvm_cpu, _own_cpu_seconds() - own_cpu
        assert summary.aggregated == records and summary.records_read == written, summary
        batch_s = ", ".join(f"{s:.1f}" for s in summary.batch_seconds)
        rows.append(row(f"aggregation records/s, local[2], run_once, {label}", written / summary.seconds,
                        "records/s", ">= 100,000; >= 3x baseline" if source == CONNECTOR else None, base_rate,
                        f"{written:,} records ({written - records:,} re-deliveries) in {summary.seconds:.1f} s, "
                        f"{summary.batches} micro-batches ({batch_s} s); baseline: consume + plain-Python "
                        f"aggregate in {base_s:.1f} s (load average {base_load:.1f}); load average "
                        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"))
        rows.append(row(f"aggregation CPU seconds per 1M records read, {label}", (jvm_cpu + own_cpu) * 1e6 / written,
                        "CPU-s", None, base_cpu * 1e6 / written,
                        f"Spark's JVM {jvm_cpu:.1f} + the driver's Python {own_cpu:.1f} CPU-s"
                        + (", not counting Spark's Python worker processes" if source == PYTHON_SOURCE else "")
                        + f"; baseline: this process's CPU for consume + aggregate, {base_cpu:.1f} CPU-s"))
    return rows


def _freshness(spark: Any, bootstrap: str, bursts: int, trigger_seconds: float) -> list[dict[str, Any]]:
    from keyrange.aggregation import read_results, start_continuous

    topic = f"bench-freshness-{trigger_seconds:g}s.processed"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)])
    stream = _Stream(bootstrap, topic, seed=8)
    delays = []
    with tempfile.TemporaryDirectory() as out:
        running = start_continuous(bootstrap, topic, out, spark=spark, trigger_seconds=trigger_seconds)
        try:
            expected = 0
            for _ in range(bursts):
                time.sleep(random.uniform(0.5, 0.5 + trigger_seconds))  # at a random phase of the trigger
                stream.send(1000, redeliver_ratio=0.0, now=True)
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
    note = (f"{bursts} bursts of 1,000 records, Spark's Kafka connector; per micro-batch "
            f"p50 {percentile(batch_s, 0.5):.2f} s (max {max(batch_s):.2f} s); load average "
            f"{os.getloadavg()[0]:.1f} at the end")
    default = " (the default)" if trigger_seconds == DEFAULT_TRIGGER_SECONDS else ""
    trigger = f"trigger {trigger_seconds:g} s{default}"
    return [
        row(f"aggregation freshness p50, continuous, {trigger} (processed -> visible)", percentile(delays, 0.5),
            "s", "<= 5 s", None, note),
        row(f"aggregation freshness max, {trigger}", max(delays), "s", None, None, note),
    ]


def run(quick: bool) -> list[dict[str, Any]]:
    """Throughput and freshness rows."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from keyrange.aggregation.session import spark_session
    from keyrange.local.kafka_cluster import QUICK_START_JVM_OPTIONS, KafkaCluster

    with KafkaCluster(nodes=1, jvm_options=QUICK_START_JVM_OPTIONS) as kafka:
        began = time.monotonic()
        spark = spark_session("local[2]", app_name="keyrange-bench")
        startup = time.monotonic() - began
        try:
            rows = _throughput(spark, kafka.bootstrap, 100_000 if quick else 1_000_000)
            for trigger_seconds in (1.0, DEFAULT_TRIGGER_SECONDS):
                rows += _freshness(spark, kafka.bootstrap, 3 if quick else 10, trigger_seconds)
        finally:
            spark.stop()
    rows.append(row("Spark local[2] session start", startup, "s", None, None, "paid once per `keyrange aggregate`"))
    return rows
