"""Hash-range slots (issue 28): more workers than partitions, side by side in one run.

- throughput: a 1-partition topic, `sleep` 10 ms with `concurrency: 4` (about 400 events/s a
  worker), 2,400 events/s offered; `workers.min = workers.max = k` (k hash-range slots, one per
  worker) for k = 1, 2, 4, 6, run as `keyrange run` runs them (the supervisor in this process,
  `keyrange worker` subprocesses). The handled rate is counted from the processed records finished
  in a window after a warm-up, against min(k x 400, offered).
- skip CPU: one partition with a backlog, read by an in-process worker holding 1 of k slots (k = 1,
  2, 4; the other k - 1 readers would hold the rest): it routes every record by its key and skips
  the others' (`Worker._slots_of_record`). The goal's figure: a backlog of only the other slots'
  clients (and one own record at its end), the process's CPU time (all threads, librdkafka's
  included) over the records skipped. Context: a backlog of every client, the CPU minus what the
  1-reader run spent per handled record, over the records skipped; and the routing step alone
  (`SlotRouter.slot_of` and `CommitWindow.pass_offset` per skipped record, no broker).
- handoff: `bench_handoff.measure_handoffs` on a 1-partition topic with `workers.max: 4` (4
  hash-range slots): back-to-back splits and merges under 1,000 events/s, the pause of each moved
  hash range from its old owner's last finished event to its new owner's first started one.
- baselines in the same run: the throughput of 6 workers on 6 whole partitions, and the handoff on
  4 whole partitions (the same slot count and moves): what the machine gives without hash ranges.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from benchmarks.bench_handoff import SPEC, measure_handoffs
from benchmarks.harness import load_average, percentile, row, running_broker, ticking, wait_until
from keyrange.handlers import load_handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.local.demo import read_values
from keyrange.local.load import Phase, produce_phases
from keyrange.local.supervisor import Supervisor
from keyrange.ranges.layout import SlotLayout, SlotRouter
from keyrange.spec import load_file
from keyrange.worker import Worker, WorkerSettings
from keyrange.worker.commitwindow import CommitWindow

OFFERED = 2_400
"""Events/s offered to the 1-partition topic."""
PER_WORKER = 400
"""What one worker handles at most: 4 permits x 100 events/s of a 10 ms handler."""
WORKER_COUNTS = (1, 2, 4, 6)
READER_COUNTS = (1, 2, 4)
CLIENTS = 1_000
"""Clients of the load: enough that k hash ranges share them evenly (each within a few percent)."""
SKIP_REPEATS = 3
"""Drains per reader count (a single 200k-record drain is ~0.2 s of CPU, and varied by +-30 %)."""


def measure_throughput(tmp: Path, bootstrap: str | None, workers: int, warmup_s: float,
                       window_s: float, partitions: int = 1) -> tuple[float, str]:
    """Events/s handled by `workers` fixed workers on `partitions` partitions with OFFERED events/s
    offered, counted over `window_s` after `warmup_s` of load; and the load averages around the window."""
    name = f"hr-throughput-{workers}-of-{partitions}"
    path = tmp / f"{name}.yaml"
    # A fixed size: the planner never rescales (scaling's figures do not matter).
    path.write_text(SPEC.format(name=name, partitions=partitions, mean_ms=10, concurrency=4, min_workers=workers,
                                max_workers=workers, high=10**9, low=0, cooldown=10))
    sup = Supervisor(load_file(path), path, bootstrap, tmp / name, tick_seconds=0.5)
    with ticking(sup) as stop:
        ctl = sup.controller
        assert ctl is not None and sup.bootstrap is not None
        reports = ctl.channel.state.reports

        def all_slots_held() -> bool:
            held = [r.held for r in list(reports.values()) if r.held]
            return len(held) == workers and sum(len(h) for h in held) == ctl.layout.slot_count

        if not wait_until(all_slots_held, 180):
            raise RuntimeError(f"{workers} workers did not all hold their slots: {ctl.status().last_decision}")
        shape = LoadShape(rate=OFFERED, clients=CLIENTS, duplicate_ratio=0.0, seed=28)
        seconds = warmup_s + window_s + 2
        load = threading.Thread(target=produce_phases, args=(sup.bootstrap, name, shape, [Phase(seconds, OFFERED)],
                                                             stop), daemon=True)
        load.start()
        time.sleep(warmup_s)
        begin_ms, load_before = time.time() * 1000, load_average()
        time.sleep(window_s)
        end_ms, load_after = time.time() * 1000, load_average()
        load.join(timeout=30)
        time.sleep(2)  # the window's last events commit (commit interval)
        processed = read_values(sup.bootstrap, f"{name}.processed")
    handled = sum(1 for r in processed if begin_ms <= r["finishedAt"] < end_ms)
    return handled / ((end_ms - begin_ms) / 1000), f"{load_before} -> {load_after}"


async def _drain_one_slot(settings: WorkerSettings, readers: int, own: int) -> tuple[float, float]:
    """(CPU s, wall s) of a worker holding slot 0 of `readers` hash ranges of partition 0 while it
    handles its `own` records of the backlog (and skips the rest)."""
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


def measure_skip_cpu(bootstrap: str, events: int) -> list[tuple[int, int, float, float]]:
    """Per reader count k: (own records, skipped records, CPU s, wall s) of a worker holding slot 0
    of k draining a backlog of `events` of every client."""
    topic = "hr-skip"
    ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    backlog = list(generate(LoadShape(clients=CLIENTS, duplicate_ratio=0.0, seed=29), count=events))
    produce_all(bootstrap, topic, backlog)
    found = []
    for readers in READER_COUNTS:
        own = sum(1 for s in backlog if SlotLayout(1, readers).slot_for_key(0, s.key) == 0)
        cpu, wall = asyncio.run(_drain_one_slot(_settings(bootstrap, topic, readers), readers, own))
        found.append((own, events - own, cpu, wall))
    return found


def measure_only_skips(bootstrap: str, events: int, readers: int, repeats: int) -> tuple[list[float], list[float]]:
    """CPU s of a worker holding slot 0 of `readers` draining `events` records all of the other
    slots' clients, then one of its own (which ends the drain): nearly all of it is skipping. Each
    of `repeats` drains is a new worker in a new group; beside them the CPU s of as many plain
    consume loops over the same records."""
    topic = f"hr-skip-only-{readers}"
    ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    layout = SlotLayout(1, readers)
    backlog = [s for s in generate(LoadShape(clients=CLIENTS, duplicate_ratio=0.0, seed=30), count=events * 2)
               if layout.slot_for_key(0, s.key) != 0][:events]
    last = next(s for s in generate(LoadShape(clients=CLIENTS, duplicate_ratio=0.0, seed=31), count=CLIENTS)
                if layout.slot_for_key(0, s.key) == 0)
    produce_all(bootstrap, topic, [*backlog, last])
    drains, raws = [], []
    for repeat in range(repeats):
        settings = _settings(bootstrap, topic, f"{readers}-{repeat}")
        drains.append(asyncio.run(_drain_one_slot(settings, readers, 1))[0])
        raws.append(raw_consume_cpu(bootstrap, topic, events) * events)
    return drains, raws


def raw_consume_cpu(bootstrap: str, topic: str, expect: int) -> float:
    """CPU s per record of a plain confluent-kafka loop reading `expect` records of `topic` from the
    start (read_committed, reading each record's key and offset): the floor any reader pays."""
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


def _settings(bootstrap: str, topic: str, readers: int | str) -> WorkerSettings:
    return WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=f"{topic}-{readers}", worker_id=f"r{readers}",
                          commit_interval_ms=100, concurrency=64)


def measure_routing_step(records: int, readers: int = 4) -> float:
    """Seconds of CPU per skipped record of the routing step alone: `SlotRouter.slot_of` on a cached
    key and `CommitWindow.pass_offset` on the skipped slot's window (what `_slots_of_record` does
    for it besides reading the record's partition, key and offset)."""
    router = SlotRouter(SlotLayout(1, readers))
    keys = [str(1000 + c).encode() for c in range(CLIENTS)]
    skipped = [k for k in keys if router.slot_of(0, k) != 0]
    window = CommitWindow(0)
    slot_of, pass_offset = router.slot_of, window.pass_offset
    n = len(skipped)
    began = time.process_time()
    for offset in range(records):
        slot_of(0, skipped[offset % n])
        pass_offset(offset)
    return (time.process_time() - began) / records


def run(quick: bool, brokers: tuple[str, ...] = ("kafka",)) -> list[dict[str, Any]]:
    """The hash-range rows on each broker; the handoff pause on Apache Kafka only (its goal's broker)."""
    rows: list[dict[str, Any]] = []
    for engine in brokers:
        rows += [{**r, "broker": engine} for r in run_on(quick, engine)]
    return rows


def run_on(quick: bool, engine: str) -> list[dict[str, Any]]:
    """Throughput, skip CPU and (on Kafka) the handoff pause, one broker for all of them."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-hash-range-") as tmpdir:
        bootstrap = stack.enter_context(running_broker(engine))
        tmp = Path(tmpdir)
        for k in WORKER_COUNTS:
            rate, load = measure_throughput(tmp, bootstrap, k, 8 if quick else 15, 10 if quick else 30)
            expected = min(k * PER_WORKER, OFFERED)
            rows.append(row(f"hash ranges: handled rate, 1 partition, {k} workers", rate, "events/s",
                            goal=f">= 0.9 x {expected:,}", baseline=expected,
                            notes=f"{OFFERED:,}/s offered, sleep 10 ms, concurrency 4; {load}"))
        # The same work on whole partitions (no hash ranges): what this machine gives 6 workers.
        k = WORKER_COUNTS[-1]
        rate, load = measure_throughput(tmp, bootstrap, k, 8 if quick else 15, 10 if quick else 30, partitions=k)
        rows.append(row(f"whole partitions: handled rate, {k} partitions, {k} workers (baseline)", rate, "events/s",
                        baseline=min(k * PER_WORKER, OFFERED),
                        notes=f"{OFFERED:,}/s offered, sleep 10 ms, concurrency 4; {load}"))
        load_before = load_average()
        skip_events = 30_000 if quick else 200_000
        skips = measure_skip_cpu(bootstrap, skip_events)
        load_after = load_average()
        own1, _, cpu1, wall1 = skips[0]
        per_handled = cpu1 / own1
        rows.append(row("hash ranges: CPU per handled record, 1 reader (no skips)", per_handled * 1e6, "us",
                        notes=f"{own1:,} records, noop handler, {wall1:.1f} s wall; {load_before} -> {load_after}"))
        for readers, (own, skipped, cpu, wall) in zip(READER_COUNTS[1:], skips[1:], strict=True):
            per_skipped = (cpu - own * per_handled) / skipped
            rows.append(row(f"hash ranges: CPU per skipped record, {readers} readers, mixed backlog",
                            per_skipped * 1e6, "us",
                            notes=f"holds 1 of {readers}: {own:,} handled, {skipped:,} skipped, {cpu:.2f} s CPU, "
                                  f"{wall:.1f} s wall; {load_before} -> {load_after}"))
        for readers in READER_COUNTS[1:]:
            load_before = load_average()
            drains, raws = measure_only_skips(bootstrap, skip_events, readers, SKIP_REPEATS)
            cpu, raw = statistics.median(drains), statistics.median(raws)
            rows.append(row(f"hash ranges: CPU per skipped record, {readers} readers, only others' records",
                            cpu / skip_events * 1e6, "us", goal="<= 1 us", baseline=raw / skip_events * 1e6,
                            notes=f"holds 1 of {readers}: {skip_events:,} skipped; median of {SKIP_REPEATS} drains "
                                  f"({', '.join(f'{d / skip_events * 1e6:.2f}' for d in drains)} us); baseline: "
                                  f"a plain consume loop of the same records, median of {SKIP_REPEATS} "
                                  f"({', '.join(f'{r / skip_events * 1e6:.2f}' for r in raws)} us); "
                                  f"{load_before} -> {load_average()}"))
        step = measure_routing_step(200_000 if quick else 2_000_000)
        rows.append(row("hash ranges: routing step alone per skipped record", step * 1e6, "us",
                        notes=f"SlotRouter.slot_of (cached key) + CommitWindow.pass_offset; {load_average()}"))
        if engine == "kafka":
            load_before = load_average()
            handoffs = measure_handoffs(tmp, 4 if quick else 12, bootstrap, warmup=4, partitions=1,
                                        name="hr-handoff")
            n = (f"1 partition, 4 hash ranges, {len(handoffs.rescales)} rescales, {len(handoffs.pauses)} range "
                 f"moves, 1,000 events/s; {load_before} -> {load_average()}")
            rows.append(row("hash ranges: moved-range pause p50", percentile(handoffs.pauses, 0.5), "s", notes=n))
            rows.append(row("hash ranges: moved-range pause p99", percentile(handoffs.pauses, 0.99), "s",
                            goal="<= 0.25 s", notes=n))
            load_before = load_average()
            whole = measure_handoffs(tmp, 4 if quick else 12, bootstrap, warmup=4, partitions=4,
                                     name="whole-handoff")
            n = (f"4 whole partitions, {len(whole.rescales)} rescales, {len(whole.pauses)} slot moves, 1,000 "
                 f"events/s; {load_before} -> {load_average()}")
            rows.append(row("whole partitions: moved-slot pause p50 (baseline)", percentile(whole.pauses, 0.5), "s",
                            notes=n))
            rows.append(row("whole partitions: moved-slot pause p99 (baseline)", percentile(whole.pauses, 0.99), "s",
                            notes=n))
            rows.append(row("hash ranges: decision -> new owner's first event (split)",
                            percentile(handoffs.splits, 0.5), "s",
                            notes=f"median of {len(handoffs.splits)}; max {max(handoffs.splits, default=0):.2f} s"))
    return rows


if __name__ == "__main__":
    from benchmarks.harness import format_table

    print(format_table(run("--quick" in sys.argv)))
