"""The worker engine's figures (issue 2, item 7), each beside a raw confluent-kafka loop.

- kata: 1000 events/s paced, `sleep` 10 ms, one `keyrange worker` process, 60 s measured after
  10 s of the same load as a warm-up (reported on its own row: a cold broker JVM and a new
  producer are as slow for the raw loop): p50/p99 of created -> handler start from the processed
  records, per 10 s window (flat, not growing); baseline: created -> receipt in a raw consume
  loop on the same topic at the same time.
- noop: a pre-produced backlog drained by one in-process worker (ordered, deduplicated,
  transactionally committed) vs a raw consume loop draining the same topic.
- sleep 10 ms: highest sustainable rate = backlog drain rate with 1000 clients.
- 50 ms I/O with 1000 clients: backlog drain rate.
- dedup memory per entry (tracemalloc).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid as uuidlib
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from benchmarks.harness import load_average, percentile, raw_consume_rate, row, running_broker
from keyrange.handlers import load_handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.worker import Worker, WorkerSettings
from keyrange.worker.dedup import TtlSet

PARTITIONS = 12
KATA_WARMUP_SECONDS = 10
REPO = Path(__file__).resolve().parents[1]


def run(quick: bool, brokers: tuple[str, ...] = ("tansu",)) -> list[dict[str, Any]]:
    """All worker benchmarks on each broker; `quick` shortens every run."""
    rows: list[dict[str, Any]] = []
    rows += bench_dedup_memory()
    for engine in brokers:
        with running_broker(engine) as bootstrap:
            found = bench_kata(bootstrap, seconds=10 if quick else 60)
            found += bench_backlog(bootstrap, "noop", "noop", {}, events=30_000 if quick else 200_000,
                                   clients=1000, concurrency=64, goal=">= 50,000 events/s")
            found += bench_backlog(bootstrap, "sleep-10ms", "sleep", {"meanMs": 10, "stddevMs": 1},
                                   events=20_000 if quick else 100_000, clients=1000, concurrency=1000,
                                   goal=">= 10,000 events/s")
            found += bench_backlog(bootstrap, "io-50ms-1000-clients", "sleep", {"meanMs": 50, "stddevMs": 0},
                                   events=20_000 if quick else 100_000, clients=1000, concurrency=1000,
                                   goal=">= 15,000 events/s")
        rows += [{**r, "broker": engine} for r in found]
    return rows


def bench_dedup_memory(entries: int = 200_000) -> list[dict[str, Any]]:
    """Bytes per remembered uuid, counting the uuid string itself and without it."""
    keys = [str(uuidlib.uuid4()) for _ in range(entries)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    seen = TtlSet(10.0, time.time)
    start = time.time() - 60
    for i, k in enumerate(keys):
        seen.add_if_new(k, start + i / 25_000)  # 25k/s for 8 s: the whole set stays inside the TTL
    structure = (tracemalloc.get_traced_memory()[0] - before) / entries
    tracemalloc.stop()
    string_bytes = sys.getsizeof(keys[0])
    assert len(seen) == entries
    return [
        row("dedup bytes per entry (with the uuid string)", structure + string_bytes, "bytes", "<= 150",
            notes=f"set + expiry bucket {structure:.0f} B, uuid str {string_bytes} B"),
    ]


def bench_kata(bootstrap: str, seconds: int) -> list[dict[str, Any]]:
    """The kata at 1000 events/s with a `keyrange worker` subprocess and `keyrange produce`."""
    topic = f"kata-{time.monotonic_ns()}"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "keyrange.cli", "worker", "--bootstrap", bootstrap, "--topic", topic,
         "--group", f"{topic}-g", "--partitions", f"0-{PARTITIONS - 1}", "--handler", "sleep",
         "--concurrency", "64", "--summary-seconds", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    raw: list[tuple[int, float]] = []
    stop_raw = threading.Event()
    raw_thread = threading.Thread(target=_raw_latency_loop, args=(bootstrap, topic, raw, stop_raw), daemon=True)
    raw_thread.start()
    try:
        _wait_until_handling(bootstrap, topic)  # the worker restored and assigned: the load may start
        load_began_ms = time.time() * 1000
        began_ms = load_began_ms + KATA_WARMUP_SECONDS * 1000
        subprocess.run(
            [sys.executable, "-m", "keyrange.cli", "produce", "--bootstrap", bootstrap, "--topic", topic,
             "--rate", "1000", "--duration", str(seconds + KATA_WARMUP_SECONDS), "--clients", "100"],
            env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(2)
    finally:
        stop_raw.set()
        worker.terminate()
        worker.wait(60)
        raw_thread.join(30)
    processed = _read_processed(bootstrap, f"{topic}.processed")
    warmup = [(r["startedAt"] - r["created"]) / 1000 for r in processed if load_began_ms <= r["created"] < began_ms]
    raw_warmup = [lat for created, lat in raw if load_began_ms <= created < began_ms]
    records = [r for r in processed if r["created"] >= began_ms]
    latencies = [(r["created"], (r["startedAt"] - r["created"]) / 1000) for r in records]
    values = [lat for _, lat in latencies]
    raw = [(created, lat) for created, lat in raw if created >= began_ms]
    raw_values = [lat for _, lat in raw]
    load = load_average()
    rows = [
        row(f"kata p99 created->start, the {KATA_WARMUP_SECONDS} s warm-up", percentile(warmup, 0.99) * 1000, "ms",
            baseline=percentile(raw_warmup, 0.99) * 1000,
            notes=f"{len(warmup):,} events of the same load before the measured run; not measured against the goal"),
        row("kata p50 created->start", percentile(values, 0.5) * 1000, "ms",
            baseline=percentile(raw_values, 0.5) * 1000, notes=f"{len(values):,} events after the warm-up"),
        row("kata p99 created->start", percentile(values, 0.99) * 1000, "ms", "<= 25",
            baseline=percentile(raw_values, 0.99) * 1000,
            notes=f"baseline: raw consume loop, created->receipt, same topic, same time; {load} at the end"),
    ]
    if latencies:
        start = min(c for c, _ in latencies)
        ordered = _windows(latencies, start)
        raw_ordered = _windows(raw, start)
        growth = percentile(ordered[-1], 0.99) / max(percentile(ordered[0], 0.99), 1e-9)
        rows.append(row("kata p99 last 10 s / first 10 s", growth, "x", "~1 (flat)",
                        notes=f"p50/p99 ms per 10 s: worker {_trend(ordered)}; raw loop {_trend(raw_ordered)}"))
    return rows


def _wait_until_handling(bootstrap: str, topic: str, timeout_seconds: float = 120.0) -> None:
    """Send one warm-up event and return once the worker's processed record of it is visible."""
    produce_all(bootstrap, topic, list(generate(LoadShape(clients=1, duplicate_ratio=0.0, seed=1), count=1)))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ready-{time.monotonic_ns()}",
                         "isolation.level": "read_committed", "log_level": 3})
    try:
        consumer.assign([TopicPartition(f"{topic}.processed", p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if any(m.error() is None for m in consumer.consume(10, 0.2)):
                return
        raise TimeoutError(f"the kata's worker handled no warm-up event in {timeout_seconds:g} s")
    finally:
        consumer.close()


def _windows(latencies: list[tuple[int, float]], start_ms: int) -> list[list[float]]:
    """Latencies grouped by 10 s windows of `created`, in time order (a short last window, the
    stragglers after the load stopped, is left out)."""
    windows: dict[int, list[float]] = {}
    for created, lat in latencies:
        if created >= start_ms:
            windows.setdefault(int((created - start_ms) / 10_000), []).append(lat)
    ordered = [v for _, v in sorted(windows.items())]
    if len(ordered) > 1 and len(ordered[-1]) < len(ordered[0]) / 2:
        ordered.pop()
    return ordered


def _trend(windows: list[list[float]]) -> str:
    return " ".join(f"{percentile(v, 0.5) * 1000:.0f}/{percentile(v, 0.99) * 1000:.0f}" for v in windows)


def _raw_latency_loop(bootstrap: str, topic: str, out: list[tuple[int, float]], stop: threading.Event) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 20, "log_level": 3})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen: set[str] = set()
        while not stop.is_set():
            # Like the worker: take what is buffered, else wait for the first record only
            # (a batch consume with a timeout waits for the whole batch).
            batch = consumer.consume(1000, 0) or consumer.consume(1, 0.05)
            for m in batch:
                if m.error() is None:
                    body = orjson.loads(m.value())
                    if body["uuid"] in seen:
                        continue  # like the worker, count each event once (duplicates arrive late)
                    seen.add(body["uuid"])
                    out.append((body["created"], time.time() - body["created"] / 1000))
    finally:
        consumer.close()


def _read_processed(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from tests.kafkatools import read_processed

    return [dict(r) for r in read_processed(bootstrap, topic)]


def bench_backlog(bootstrap: str, name: str, handler: str, config: dict[str, Any], events: int, clients: int,
                  concurrency: int, goal: str) -> list[dict[str, Any]]:
    """Drain a pre-produced backlog with one in-process worker; compare with a raw consume loop."""
    topic = f"{name}-{time.monotonic_ns()}"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)])
    shape = LoadShape(clients=clients, duplicate_ratio=0.01, seed=11)
    records = list(generate(shape, count=events))
    produce_all(bootstrap, topic, records)
    distinct = events
    raw_rate = raw_consume_rate(bootstrap, topic, PARTITIONS, len(records))
    load = load_average()
    cpu_before = time.process_time()
    seconds, stats = asyncio.run(_drain(bootstrap, topic, handler, config, concurrency, distinct))
    cpu_us = (time.process_time() - cpu_before) / len(records) * 1e6
    # The rate between 10 % and 90 % of the backlog: the sustained rate, without the start-up
    # (restore, first fetch) and the tail (the clients with the most events finish last).
    rate = 0.8 * distinct / seconds
    return [row(f"{name} events/s (one worker)", rate, "events/s", goal, baseline=raw_rate,
                notes=f"{distinct:,} events, {clients} clients, concurrency {concurrency}; "
                      f"{stats.duplicates} duplicates dropped; 10-90 % of the backlog; baseline: raw consume loop; "
                      f"{cpu_us:.0f} us CPU per record (all threads of the worker process); {load} at the start")]


async def _drain(bootstrap: str, topic: str, handler: str, config: dict[str, Any], concurrency: int,
                 distinct: int) -> tuple[float, Any]:
    settings = WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=f"{topic}-g", worker_id="bench",
                              concurrency=concurrency, max_pending=5000, handler_config=config)
    worker = Worker(settings, load_handler(handler, config))
    await worker.start()
    try:
        await worker.acquire(range(PARTITIONS))
        deadline = time.monotonic() + 600
        marks: dict[float, float] = {}
        while worker.stats.processed < distinct and time.monotonic() < deadline:
            for share in (0.1, 0.9):
                if share not in marks and worker.stats.processed >= share * distinct:
                    marks[share] = time.monotonic()
            await asyncio.sleep(0.01)
        marks.setdefault(0.9, time.monotonic())
        return marks[0.9] - marks.get(0.1, marks[0.9] - 1e-9), worker.stats
    finally:
        await worker.stop()
