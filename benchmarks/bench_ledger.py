"""Ledger benchmarks: one `keyrange worker` process against a raw consume-and-produce loop process.

- throughput: a pre-produced backlog of ledger commands (1,000 clients, 1 % re-sent duplicates)
  drained by one `keyrange worker --handler ledger` process (ordered per client, deduplicated,
  outputs + state + offsets in one transaction per commit interval), by `benchmarks.leanloop` (the
  worker's per-event work in one plain loop: what the engine's structure costs is the gap), and by
  `benchmarks.rawloop` (the same per-client counter in a dict) transactional and plain, each in its
  own process and consumer group on the same topic, after a warm-up round, interleaved round by
  round. The rate is taken between 10 % and 90 % of the backlog's offsets, as the group's committed
  offsets show (polled every 50 ms), with the process's CPU time over the same span;
  `python -m benchmarks.bench_ledger --drains [--quick] [--broker kafka|tansu]` runs these alone.
  On Kafka the ledger drains once more with the broker's JVM on one core and the worker (or the
  raw loop) on the other (`harness.cores_apart`), as when the brokers have machines of their own:
  what one worker does with one core to itself.
- hot counter: every command to one clientId (one partition, strictly serial read-modify-write
  of one counter: the interdependent-writes problem). A backlog drain gives the ceiling; then a
  paced stream (`keyrange produce --clients 1 --ledger`) at the goal's rate gives latency: created
  -> the result visible to a read_committed reader of the output topic (the command's commit),
  p50/p90/p99, for the worker and for the transactional raw loop, one after the other, interleaved
  round by round, with the handled rate taken while the load is paced (`steady_rate`).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from benchmarks.harness import (
    BROKERS,
    can_place_apart,
    cores_apart,
    format_table,
    load_average,
    percentile,
    process_cpu_seconds,
    process_peak_rss_mib,
    row,
    running_broker_processes,
)
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, Scheduled, generate, make_producer, produce_all
from keyrange.ranges.slots import partition_for_key

PARTITIONS = 12
REPO = Path(__file__).resolve().parents[1]
LEAN = "lean loop"
"""`benchmarks.leanloop`: the worker's per-event work without its engine (issue 27, item 7)."""
MODES = ("keyrange", LEAN, "raw transactional", "raw plain")
MAPPED = "keyrange mapped"
"""A keyrange worker reading the ledger topic as another team's topic (issue 31, docs/input.md)."""
WITH_HEADER = "keyrange, records with a header"
"""The default mapping reading the default records with the mapped topic's `event-id` header."""
MAPPED_FLAGS = ["--input-client-id", "key", "--input-uuid", "header:event-id", "--input-created", "timestamp"]
HOT_COMMIT_INTERVAL_MS = 20
"""The hot counter's commit interval: a command is done when its transaction commits, so the
default 100 ms alone would exceed the 50 ms latency goal."""
HOT_COUNTER_RATE = 17_500
"""New commands per second offered to the paced hot counter (plus about 1 % re-sent duplicates,
which the worker drops): 3 % above the goal's 17,000, so that a worker keeping up shows a handled
rate over the goal, not one within the measurement's rounding of it."""


def run(quick: bool, brokers: tuple[str, ...] = ("tansu",)) -> list[dict[str, Any]]:
    """Throughput and hot-counter rows on each broker."""
    rows: list[dict[str, Any]] = []
    for engine in brokers:
        with running_broker_processes(engine) as (bootstrap, broker_pids):
            rows += ledger_drains(bootstrap, engine, quick)
            if can_place_apart(broker_pids):
                # In production the brokers have machines of their own; here they share the worker's
                # 2 cores unless told apart.
                with cores_apart(broker_pids) as layout:
                    rows += bench_throughput(bootstrap, engine, events=50_000 if quick else 200_000, clients=1000,
                                             rounds=1 if quick else 3, name="ledger on a core of its own",
                                             modes=("keyrange", "raw transactional"), layout=layout)
            rows += bench_throughput(bootstrap, engine, events=100_000 if quick else 200_000, clients=1,
                                     rounds=1 if quick else 3, name="hot counter backlog",
                                     modes=("keyrange", "raw transactional"))
            rows += bench_hot_counter(bootstrap, engine, rate=HOT_COUNTER_RATE, seconds=10 if quick else 20,
                                      rounds=1 if quick else 3)
            rows += bench_mapping(bootstrap, engine, events=50_000 if quick else 200_000, rounds=3)
    return rows


def ledger_drains(bootstrap: str, engine: str, quick: bool) -> list[dict[str, Any]]:
    """The ledger backlog (1,000 clients) drained by the worker, the lean loop and the raw loops,
    side by side on shared cores: the row issue 27 item 7 reads."""
    return bench_throughput(bootstrap, engine, events=50_000 if quick else 200_000, clients=1000,
                            rounds=1 if quick else 3, name="ledger", warmup=not quick)


def _env() -> dict[str, str]:
    # This checkout's src first: the venv's editable install may be another checkout's.
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}


def _command(mode: str, bootstrap: str, topic: str, group: str, commit_interval_ms: int,
             max_pending: int | None = None) -> list[str]:
    """The process of `mode`; a keyrange worker with the default `maxPending` unless one is given."""
    if mode in ("keyrange", MAPPED):
        pending = [] if max_pending is None else ["--max-pending", str(max_pending)]
        return [sys.executable, "-m", "keyrange.cli", "worker", "--bootstrap", bootstrap, "--topic", topic,
                "--group", group, "--partitions", f"0-{PARTITIONS - 1}", "--handler", "ledger",
                "--sink-topic", f"{topic}.{group}", "--commit-interval-ms", str(commit_interval_ms),
                *pending, "--summary-seconds", "0", *(MAPPED_FLAGS if mode == MAPPED else [])]
    module = "benchmarks.leanloop" if mode == LEAN else "benchmarks.rawloop"
    cmd = [sys.executable, "-m", module, "--bootstrap", bootstrap, "--topic", topic,
           "--output", f"{topic}.{group}", "--group", group, "--partitions", str(PARTITIONS),
           "--commit-interval-ms", str(commit_interval_ms)]
    return [*cmd, "--transactional"] if mode == "raw transactional" else cmd


def _stop(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _committed_total(watcher: Consumer, tps: list[TopicPartition]) -> int | None:
    """The group's committed offsets summed; None while Kafka's group coordinator is still loading
    (a new group's first lookups answer NOT_COORDINATOR)."""
    try:
        return sum(max(tp.offset, 0) for tp in watcher.committed(tps, timeout=30))
    except KafkaException as exc:
        if exc.args[0].retriable() or exc.args[0].code() == KafkaError.NOT_COORDINATOR:
            return None
        raise


def _coordinator_found(watcher: Consumer, tps: list[TopicPartition]) -> None:
    """Wait until the group's committed offsets can be read: otherwise a drain that starts while
    the coordinator loads would be done before its first reading (no 10-90 % span to time)."""
    deadline = time.monotonic() + 60
    while _committed_total(watcher, tps) is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the group coordinator did not answer within 60 s")
        time.sleep(0.1)


class Drain(NamedTuple):
    rate: float
    """Records/s between 10 % and 90 % of the records' offsets committed."""
    cpu_us: float
    """CPU microseconds per record over that span."""
    peak_rss_mib: float
    """The process's peak resident memory, read when 90 % were committed."""


def drain(bootstrap: str, topic: str, mode: str, group: str, total: int) -> Drain:
    """One process (`mode`) drains `total` records of `topic` as consumer group `group`."""
    ensure_topics(bootstrap, [TopicSpec(f"{topic}.{group}", PARTITIONS)], timeout_seconds=60)
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    _coordinator_found(watcher, tps)
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below, after the process
    process = subprocess.Popen(_command(mode, bootstrap, topic, group, 100), env=_env(),
                               stdout=subprocess.DEVNULL, stderr=errors)
    marks: dict[float, tuple[float, float]] = {}
    peak_rss_mib = 0.0
    try:
        deadline = time.monotonic() + 600
        while len(marks) < 2 and time.monotonic() < deadline:
            if process.poll() is not None:
                errors.seek(0)
                raise RuntimeError(f"{mode} exited with {process.returncode}: {errors.read()[-2000:].decode()}")
            done = _committed_total(watcher, tps) or 0
            for share in (0.1, 0.9):
                if share not in marks and done >= share * total:
                    marks[share] = (time.monotonic(), process_cpu_seconds(process))
                    peak_rss_mib = process_peak_rss_mib(process)
            time.sleep(0.05)
    finally:
        _stop(process)
        watcher.close()
        errors.close()
    if len(marks) < 2:
        raise TimeoutError(f"{mode} did not drain {total:,} records in time")
    (t10, cpu10), (t90, cpu90) = marks[0.1], marks[0.9]
    if t10 == t90:
        raise RuntimeError(f"{mode}: 10 % and 90 % committed showed in one reading; nothing to time")
    span = 0.8 * total
    return Drain(span / max(t90 - t10, 1e-9), (cpu90 - cpu10) / span * 1e6, peak_rss_mib)


def bench_throughput(bootstrap: str, engine: str, events: int, clients: int, rounds: int, name: str,
                     modes: tuple[str, ...] = MODES, layout: str = "", warmup: bool = False) -> list[dict[str, Any]]:
    """Each mode drains the same backlog once per round, interleaved; medians and ranges.
    `layout` says where the processes ran when they were placed on cores (see `cores_apart`);
    `warmup`: one round first whose figures are not kept (a new broker's first drains are slow)."""
    topic = f"{name.replace(' ', '-')}-{time.monotonic_ns()}"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)], timeout_seconds=60)
    records = list(generate(LoadShape(clients=clients, duplicate_ratio=0.01, ledger=True, seed=21), count=events))
    produce_all(bootstrap, topic, records)
    results: dict[str, list[Drain]] = {m: [] for m in modes}
    loads: dict[str, list[str]] = {m: [] for m in modes}
    for r in range(-1 if warmup else 0, rounds):
        for mode in modes:
            load = load_average()
            d = drain(bootstrap, topic, mode, f"{re.sub('[^A-Za-z0-9_-]+', '-', mode)}-{r}", len(records))
            if r >= 0:
                loads[mode].append(load)
                results[mode].append(d)
            which = f"round {r}" if r >= 0 else "warm-up"
            print(f"   {engine} {name} {which} {mode}: {d.rate:,.0f}/s, {d.cpu_us:.1f} us CPU/record, "
                  f"peak RSS {d.peak_rss_mib:.0f} MiB ({load})", file=sys.stderr, flush=True)
    medians = {m: statistics.median(x.rate for x in results[m]) for m in modes}
    peaks = {m: max(x.peak_rss_mib for x in results[m]) for m in modes}
    rows = []
    for mode in modes:
        rates = [x.rate for x in results[mode]]
        cpu = statistics.median(x.cpu_us for x in results[mode])
        keyrange = mode == "keyrange"
        notes = (f"median of {len(rates)}, runs {[round(x) for x in rates]}; {cpu:.1f} us CPU/record; "
                 f"peak RSS {[round(x.peak_rss_mib) for x in results[mode]]} MiB; "
                 f"{len(records):,} records ({events:,} commands + duplicates), {clients} client(s); "
                 f"{loads[mode]}" + (f"; {layout}" if layout else ""))
        if keyrange and "raw plain" in medians:
            notes += f"; ratio to the plain raw loop {medians['keyrange'] / medians['raw plain']:.2f}"
        rows.append(row(
            f"{name}: {mode} records/s (one process)", medians[mode], "records/s",
            ">= 100,000 events/s" if keyrange and clients > 1 else None,
            baseline=medians["raw transactional"] if keyrange else None,
            notes=notes + ("; baseline: the transactional raw loop" if keyrange else ""), broker=engine))
    if "keyrange" in results and LEAN in results:
        cpu_us = {m: statistics.median(x.cpu_us for x in results[m]) for m in ("keyrange", LEAN)}
        rows.append(row(f"{name}: keyrange CPU per record", cpu_us["keyrange"], "us", "<= 12 us (issue 27)",
                        baseline=cpu_us[LEAN], broker=engine,
                        notes=f"process CPU (all threads) over the 10-90 % span, median of {rounds}: keyrange "
                              f"{[round(x.cpu_us, 1) for x in results['keyrange']]}, lean loop "
                              f"{[round(x.cpu_us, 1) for x in results[LEAN]]}; baseline: the lean loop's"))
    if "keyrange" in peaks and "raw transactional" in peaks:
        # Not a goal of issue 11; kept in view because a worker pod's memory limit is 1 GiB (the chart).
        rows.append(row(f"{name}: keyrange worker peak RSS", peaks["keyrange"], "MiB",
                        baseline=peaks["raw transactional"], broker=engine,
                        notes=f"highest of {len(results['keyrange'])} drains, {PARTITIONS} slots held; "
                              "baseline: the transactional raw loop's"))
    return rows


MAPPING_KINDS = ("default", "headers", "mapped")
"""How `bench_mapping`'s topics hold the same commands: keyrange's own records (`default`), those
records with the mapped topic's `event-id` header (`headers`), and as another team writes them
(`mapped`: the key `user-<clientId>`, the uuid in the `event-id` header, `created` as the record
timestamp; the value byte for byte the same)."""
MAPPING_BATCH_EVERY = 12_000
"""`produce_as` flushes after this many records, so that each partition's batch is its share of
them (about 1,000 records over 12 partitions) on every kind of topic alike."""


def produce_as(kind: str, bootstrap: str, topic: str, records: list[Scheduled]) -> None:
    """`records` written as `kind` (MAPPING_KINDS) so that the kinds differ only in each record's key
    and headers: one producer configuration (keyrange's, `make_producer`), each record in the
    partition murmur2 of its clientId picks (where the default topic has it, for every kind), and
    the same batches (a flush every MAPPING_BATCH_EVERY records; the linger never cuts one): a
    producer's own batches follow its settings and speed, and the mapped topic's were once 3-5x
    smaller than the default's (BENCHMARKS.md, "Input mapping")."""
    if kind not in MAPPING_KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of {MAPPING_KINDS}")
    producer = make_producer(bootstrap, **{"linger.ms": 60_000})
    for start in range(0, len(records), MAPPING_BATCH_EVERY):
        for r in records[start:start + MAPPING_BATCH_EVERY]:
            body = orjson.loads(r.value)
            key = f"user-{body['clientId']}".encode() if kind == "mapped" else r.key
            headers = None if kind == "default" else [("event-id", body["uuid"].encode())]
            while True:
                try:
                    producer.produce(topic, r.value, key, partition=partition_for_key(r.key, PARTITIONS),
                                     timestamp=r.created_ms, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(60):
            raise KafkaException(f"records not delivered to the {kind} topic {topic}")


def bench_mapping(bootstrap: str, engine: str, events: int, rounds: int) -> list[dict[str, Any]]:
    """The ledger's throughput under `clientId: key, uuid: header:event-id, created: timestamp`
    against the default mapping, the same commands on three topics, drained in turn each round
    (issue 31: the mapping must not cost more than 5 %): the default topic, the mapped one, and the
    default records with the mapped topic's header (read by the default mapping: what carrying the
    header costs, apart from what the mapping does). The topics are written alike (`produce_as`:
    same producer, partitions and batches), and each round starts one topic later, so that no topic
    always drains in the same place of a round (a new broker's first drains are the slowest)."""
    topic = f"ledger-mapping-{time.monotonic_ns()}"
    kinds = {"keyrange": "default", WITH_HEADER: "headers", MAPPED: "mapped"}
    sources = {"keyrange": topic, WITH_HEADER: f"{topic}-header", MAPPED: f"{topic}-mapped"}
    ensure_topics(bootstrap, [TopicSpec(t, PARTITIONS) for t in sources.values()], timeout_seconds=60)
    records = list(generate(LoadShape(clients=1000, duplicate_ratio=0.01, ledger=True, seed=21), count=events))
    for mode, source in sources.items():
        produce_as(kinds[mode], bootstrap, source, records)
    rates: dict[str, list[float]] = {mode: [] for mode in sources}
    cpu: dict[str, list[float]] = {mode: [] for mode in sources}
    loads: list[str] = []
    modes = list(sources)
    for r in range(rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            loads.append(load := load_average())
            group = f"{re.sub('[^A-Za-z0-9_-]+', '-', mode)}-{r}"  # Kafka refuses other characters in topic names
            d = drain(bootstrap, sources[mode], MAPPED if mode == MAPPED else "keyrange", group, len(records))
            rates[mode].append(d.rate)
            cpu[mode].append(d.cpu_us)
            print(f"   {engine} mapping round {r} {mode}: {d.rate:,.0f}/s, {d.cpu_us:.1f} us CPU/record "
                  f"({load})", file=sys.stderr, flush=True)
    default, mapped = statistics.median(rates["keyrange"]), statistics.median(rates[MAPPED])
    median_cpu = {mode: statistics.median(values) for mode, values in cpu.items()}
    return [row("ledger, mapped input: keyrange records/s (one process)", mapped, "records/s",
                "<= 5 % below the default mapping", baseline=default, broker=engine,
                notes=f"median of {rounds}: mapped {[round(x) for x in rates[MAPPED]]}, default "
                      f"{[round(x) for x in rates['keyrange']]}; {' '.join(MAPPED_FLAGS)}; baseline: the default "
                      f"mapping, same commands, topics written alike (produce_as); {loads[0]} to {loads[-1]}"),
            row("ledger, mapped input: worker CPU per record", median_cpu[MAPPED], "us",
                "<= 5 % above the default mapping", baseline=median_cpu["keyrange"], broker=engine,
                notes=f"process CPU (all threads) over the 10-90 % span, median of {rounds}: mapped "
                      f"{[round(x, 1) for x in cpu[MAPPED]]}, default {[round(x, 1) for x in cpu['keyrange']]}, "
                      f"default records with the header {[round(x, 1) for x in cpu[WITH_HEADER]]}")]


class _Receipts:
    """A read_committed reader of an output topic noting when each result became visible."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.seen: list[tuple[int, float]] = []
        """(created ms, visible at s since the epoch) per output record."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(bootstrap, topic), daemon=True)
        self._thread.start()

    def _read(self, bootstrap: str, topic: str) -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"receipts-{time.monotonic_ns()}",
                             "enable.auto.commit": False, "isolation.level": "read_committed",
                             "fetch.wait.max.ms": 5, "log_level": 3})
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
            while not self._stop.is_set():
                batch = consumer.consume(10_000, 0) or consumer.consume(1, 0.05)
                now = time.time()
                self.seen.extend((orjson.loads(m.value())["created"], now) for m in batch if m.error() is None)
        finally:
            consumer.close()

    def wait_for(self, count: int, timeout_seconds: float) -> bool:
        deadline = time.monotonic() + timeout_seconds
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.seen) >= count

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def hot_counter_run(bootstrap: str, mode: str, rate: int, seconds: int) -> dict[str, Any]:
    """One paced run into a fresh topic: offered and handled rate, created -> visible latencies."""
    topic = f"hot-{mode.replace(' ', '-')}-{time.monotonic_ns()}"
    group = "g"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS), TopicSpec(f"{topic}.{group}", PARTITIONS)],
                  timeout_seconds=60)
    receipts = _Receipts(bootstrap, f"{topic}.{group}")
    process = subprocess.Popen(_command(mode, bootstrap, topic, group, HOT_COMMIT_INTERVAL_MS, max_pending=100_000),
                               env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Ready when a first command's result is visible (the worker restored and assigned).
        produce_all(bootstrap, topic, list(generate(LoadShape(clients=1, ledger=True, seed=1), count=1)))
        if not receipts.wait_for(1, 120):
            raise TimeoutError(f"{mode} handled no warm-up command in 120 s")
        began = time.time()
        load = load_average()
        produced = subprocess.run(
            [sys.executable, "-m", "keyrange.cli", "produce", "--bootstrap", bootstrap, "--topic", topic,
             "--rate", str(rate), "--duration", str(seconds), "--clients", "1", "--ledger", "--seed", "7"],
            env=_env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        summary = produced.stderr.strip().splitlines()[-1] if produced.stderr.strip() else ""
        # "produced N events (D duplicates) in S s: R/s over the T s of new events, then ...": N counts
        # the duplicates too; R is the offered rate over the T s of new events, before the late
        # duplicates' tail (up to loadgen.DUPLICATE_DELAY_MAX_S).
        found = re.match(r"produced ([\d,]+) events \(([\d,]+) duplicates\) in [\d.,]+ s: ([\d,]+)/s over the "
                         r"([\d.,]+) s of new events", summary)
        if found is None:
            raise RuntimeError(f"unexpected summary from keyrange produce: {summary!r}")
        sent, duplicates, offered = (int(g.replace(",", "")) for g in found.groups()[:3])
        paced_seconds = float(found[4].replace(",", ""))
        # Every command's result: the raw loop writes one per record, keyrange one per distinct command.
        receipts.wait_for(1 + sent - (duplicates if mode == "keyrange" else 0), 120)
    finally:
        _stop(process)
        receipts.stop()
    seen = [(c, v) for c, v in receipts.seen[1:] if c >= began * 1000]
    latencies = [v - c / 1000 for c, v in seen]
    return {"offered": offered, "handled": steady_rate([v for _, v in seen], paced_seconds),
            "p50": percentile(latencies, 0.5), "p90": percentile(latencies, 0.9),
            "p99": percentile(latencies, 0.99), "load": load}


STEADY_EDGE_SECONDS = 1.0
"""Left out at each end of the paced span when taking the handled rate: the start and the end."""


def steady_rate(visible_s: list[float], paced_seconds: float) -> float:
    """Results made visible per second while the commands came at the offered rate: from
    STEADY_EDGE_SECONDS after the first result to as long before the paced span's end. Not over
    every result: the raw loop also writes one for each late duplicate, which the load sends up
    to 5 s after its last new command, and that tail would spread its count over a longer time."""
    if not visible_s:
        return 0.0
    first = min(visible_s)
    start, end = first + STEADY_EDGE_SECONDS, first + paced_seconds - STEADY_EDGE_SECONDS
    if end <= start:
        raise ValueError(f"a paced span of {paced_seconds:g} s is too short for a steady rate")
    return sum(start <= v < end for v in visible_s) / (end - start)


def bench_hot_counter(bootstrap: str, engine: str, rate: int, seconds: int, rounds: int) -> list[dict[str, Any]]:
    """The paced hot counter: the transactional raw loop and the worker, one after the other, on
    the same broker, interleaved round by round; medians and ranges (latency moves with the load
    of the 2 shared cores from run to run)."""
    modes = ("raw transactional", "keyrange")
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for r in range(rounds):
        for mode in modes:
            results[mode].append(run := hot_counter_run(bootstrap, mode, rate, seconds))
            print(f"   {engine} hot counter round {r} {mode}: offered {run['offered']:,.0f}/s handled "
                  f"{run['handled']:,.0f}/s p50/p90/p99 {run['p50'] * 1000:.0f}/{run['p90'] * 1000:.0f}/"
                  f"{run['p99'] * 1000:.0f} ms ({run['load']})", file=sys.stderr, flush=True)

    def median(mode: str, key: str) -> float:
        return float(statistics.median(run[key] for run in results[mode]))

    def runs(mode: str, key: str, scale: float = 1.0) -> list[int]:
        return [round(run[key] * scale) for run in results[mode]]

    k, raw = "keyrange", "raw transactional"
    note = (f"median of {rounds}; one clientId, {rate:,}/s offered for {seconds} s (achieved: keyrange "
            f"{runs(k, 'offered')}/s, raw loop {runs(raw, 'offered')}/s); commit interval {HOT_COMMIT_INTERVAL_MS} ms; "
            f"baseline: the transactional raw loop, run just before in each round; "
            f"{[run['load'] for run in results[k]]}")
    return [
        row("hot counter: commands/s handled (paced)", median(k, "handled"), "commands/s", ">= 17,000",
            median(raw, "handled"), notes=f"runs {runs(k, 'handled')}, raw loop {runs(raw, 'handled')}; "
                                          "steady rate while the load is paced; " + note, broker=engine),
        row("hot counter: p90 created -> committed result visible", median(k, "p90") * 1000, "ms", "<= 50",
            median(raw, "p90") * 1000,
            notes=f"runs {runs(k, 'p90', 1000)} ms, raw loop {runs(raw, 'p90', 1000)} ms; medians: p50 "
                  f"{median(k, 'p50') * 1000:.0f} ms, p99 {median(k, 'p99') * 1000:.0f} ms; raw loop p50 "
                  f"{median(raw, 'p50') * 1000:.0f} ms, p99 {median(raw, 'p99') * 1000:.0f} ms", broker=engine),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run this module's benchmarks, or with `--drains` only the side-by-side ledger drains
    (`ledger_drains`), and print them as a table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_ledger", description=main.__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--broker", choices=[*BROKERS, "both"], default="both")
    parser.add_argument("--drains", action="store_true", help="only the ledger drains (issue 27, item 7)")
    parser.add_argument("--mapping", action="store_true", help="only the input mapping's drains (issue 31)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --mapping")
    args = parser.parse_args(argv)
    brokers = BROKERS if args.broker == "both" else (args.broker,)
    rows: list[dict[str, Any]] = []
    for engine in brokers if args.drains or args.mapping else ():
        with running_broker_processes(engine) as (bootstrap, _):
            if args.drains:
                rows += ledger_drains(bootstrap, engine, args.quick)
            if args.mapping:
                rows += bench_mapping(bootstrap, engine, 50_000 if args.quick else 200_000, args.rounds)
    print(format_table(rows if rows else run(args.quick, brokers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
