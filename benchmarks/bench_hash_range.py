"""Hash-range slots (issue 28): more workers than partitions, side by side in one run.

- throughput: a 1-partition topic, `sleep` 10 ms with `concurrency: 4` (about 400 events/s a
  worker), 2,400 events/s offered; `workers.min = workers.max = k` (k hash-range slots, one per
  worker) for k = 1, 2, 4, 6, run as `keyrange run` runs them (the supervisor in this process,
  `keyrange worker` subprocesses). The handled rate is counted from the processed records finished
  in a window after a warm-up, against min(k x 400, offered).
- skip CPU: one partition with a backlog, read by a worker holding 1 of k slots (k = 1, 2, 4; the
  other k - 1 readers would hold the rest), each drain in a process of its own (skipdrain.py): it
  routes each fetched batch by the records' keys and skips the others' (worker/routing.py). The
  goal's figure: a backlog of only the other slots' clients (and one own record at its end), the
  process's CPU time (all threads, librdkafka's included) over the records skipped. Context: a
  backlog of every client, the CPU minus what the 1-reader run spent per handled record, over the
  records skipped; and the routing step alone (`BatchRouter` on fetched batches, no broker).
  `--before SRC` also drains with the keyrange of another checkout (SRC: its `src` directory),
  alternating with this one's, drain by drain: old and new code side by side at the same load.
- handoff: `bench_handoff.measure_handoffs` on a 1-partition topic with `workers.max: 4` (4
  hash-range slots): back-to-back splits and merges under 1,000 events/s, the pause of each moved
  hash range from its old owner's last finished event to its new owner's first started one.
- baselines in the same run: the throughput of 6 workers on 6 whole partitions, and the handoff on
  4 whole partitions (the same slot count and moves): what the machine gives without hash ranges.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Message

from benchmarks.bench_handoff import SPEC, measure_handoffs
from benchmarks.harness import load_average, percentile, row, running_broker, ticking, wait_until
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.local.demo import read_values
from keyrange.local.load import Phase, produce_phases
from keyrange.local.supervisor import Supervisor
from keyrange.ranges.layout import SlotLayout, SlotRouter
from keyrange.spec import load_file
from keyrange.worker.restore import RestoredPartition
from keyrange.worker.routing import BatchRouter
from keyrange.worker.slot import SlotMetrics, SlotState
from keyrange.worker.snapshots import slot_totals_key

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
ROOT = Path(__file__).resolve().parent.parent
"""The checkout the benchmarks run from (skipdrain.py's processes import its `benchmarks`)."""


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


def in_own_process(args: list[str], src: Path | None = None) -> list[float]:
    """The figures `python -m benchmarks.skipdrain ARGS` prints, run with the keyrange of `src`
    (default: the one imported here)."""
    import keyrange

    keyrange_src = src or Path(keyrange.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(keyrange_src), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "benchmarks.skipdrain", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode:
        raise RuntimeError(f"skipdrain {args} failed: {done.stderr[-2000:]}")
    return [float(x) for x in done.stdout.split()]


def drain(bootstrap: str, topic: str, readers: int, group: str, own: int,
          src: Path | None = None) -> tuple[float, float]:
    """(CPU s, wall s) of a worker holding slot 0 of `readers` draining `topic` until it handled
    `own` records, in a process of its own (skipdrain.py)."""
    cpu, wall = in_own_process(["drain", bootstrap, topic, str(readers), group, str(own)], src)
    return cpu, wall


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
        cpu, wall = drain(bootstrap, topic, readers, f"{topic}-{readers}", own)
        found.append((own, events - own, cpu, wall))
    return found


def measure_only_skips(bootstrap: str, events: int, readers: int, repeats: int,
                       before: Path | None = None) -> tuple[list[float], list[float], list[float]]:
    """CPU s of a worker holding slot 0 of `readers` draining `events` records all of the other
    slots' clients, then one of its own (which ends the drain): nearly all of it is skipping. Each
    of `repeats` drains is a new worker in a new group; beside them the CPU s of as many plain
    consume loops over the same records, and (with `before`, the src directory of another
    checkout) as many drains by that checkout's worker, each right before or after one of this one's."""
    topic = f"hr-skip-only-{readers}"
    ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    layout = SlotLayout(1, readers)
    backlog = [s for s in generate(LoadShape(clients=CLIENTS, duplicate_ratio=0.0, seed=30), count=events * 2)
               if layout.slot_for_key(0, s.key) != 0][:events]
    last = next(s for s in generate(LoadShape(clients=CLIENTS, duplicate_ratio=0.0, seed=31), count=CLIENTS)
                if layout.slot_for_key(0, s.key) == 0)
    produce_all(bootstrap, topic, [*backlog, last])
    drains: list[float] = []
    befores: list[float] = []
    raws: list[float] = []
    for repeat in range(repeats):
        # Which goes first alternates: a load that changes during the pair weighs on both alike.
        sides = [(drains, None), (befores, before)] if before is not None else [(drains, None)]
        for cpus, src in sides if repeat % 2 == 0 else reversed(sides):
            cpus.append(drain(bootstrap, topic, readers, f"{topic}-{readers}-{repeat}-{len(cpus)}-{src is None}", 1,
                              src)[0])
        raws.append(in_own_process(["raw", bootstrap, topic, str(events)])[0] * events)
    return drains, raws, befores


def measure_routing_step(records: int, readers: int = 4) -> float:
    """Seconds of CPU per skipped record of the routing step alone: `BatchRouter` routing fetched
    batches of 1,000 records of the other slots' clients (cached keys) for a worker holding slot 0
    of `readers`, and passing the slot past each batch (what the dispatch does with them)."""
    layout = SlotLayout(1, readers)
    slot = SlotState(0, 0, RestoredPartition(0), 10.0, time.time, SlotMetrics("bench", "w", "0:0"),
                     None, 0, slot_totals_key(layout, 0), readers)  # type: ignore[arg-type]
    routing = BatchRouter(SlotRouter(layout), {0: [slot]})
    keys = [str(1000 + c).encode() for c in range(CLIENTS)]
    skipped = [k for k in keys if layout.slot_for_key(0, k) != 0]
    batches = [[Message(topic="t", partition=0, offset=o, key=skipped[o % len(skipped)], value=b"{}")
                for o in range(b, b + 1000)] for b in range(0, records, 1000)]
    routing.route(batches[0])  # the keys' parts cached, as in a drain
    began = time.process_time()
    for batch in batches:
        routing.pass_ends(routing.route(batch).ends)
    return (time.process_time() - began) / (len(batches) * 1000)


def run(quick: bool, brokers: tuple[str, ...] = ("kafka",), skip_only: bool = False,
        before: Path | None = None) -> list[dict[str, Any]]:
    """The hash-range rows on each broker; the handoff pause on Apache Kafka only (its goal's broker).
    `skip_only`: the skip CPU rows alone; `before`: with those of another checkout's worker beside them."""
    rows: list[dict[str, Any]] = []
    for engine in brokers:
        rows += [{**r, "broker": engine} for r in run_on(quick, engine, skip_only, before)]
    return rows


def run_on(quick: bool, engine: str, skip_only: bool = False, before: Path | None = None) -> list[dict[str, Any]]:
    """Throughput, skip CPU and (on Kafka) the handoff pause, one broker for all of them."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-hash-range-") as tmpdir:
        bootstrap = stack.enter_context(running_broker(engine))
        tmp = Path(tmpdir)
        if not skip_only:
            rows += throughput_rows(tmp, bootstrap, quick)
        rows += skip_rows(bootstrap, quick, before)
        if engine == "kafka" and not skip_only:
            rows += handoff_rows(tmp, bootstrap, quick)
    return rows


def throughput_rows(tmp: Path, bootstrap: str, quick: bool) -> list[dict[str, Any]]:
    """The handled rate of 1, 2, 4 and 6 workers on hash ranges of one partition, and of 6 on whole ones."""
    rows = []
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
    return rows


def skip_rows(bootstrap: str, quick: bool, before: Path | None) -> list[dict[str, Any]]:
    """CPU per skipped record: mixed backlogs, backlogs of only others' records (the goal's figure;
    with `before`, beside another checkout's), and the routing step alone."""
    rows = []
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

    def each(cpus: list[float]) -> str:
        return ", ".join(f"{c / skip_events * 1e6:.2f}" for c in cpus)

    for readers in READER_COUNTS[1:]:
        load_before = load_average()
        drains, raws, befores = measure_only_skips(bootstrap, skip_events, readers, SKIP_REPEATS, before)
        cpu, raw = statistics.median(drains), statistics.median(raws)
        rows.append(row(f"hash ranges: CPU per skipped record, {readers} readers, only others' records",
                        cpu / skip_events * 1e6, "us", goal="<= 1 us", baseline=raw / skip_events * 1e6,
                        notes=f"holds 1 of {readers}: {skip_events:,} skipped; median of {SKIP_REPEATS} drains "
                              f"({each(drains)} us); baseline: a plain consume loop of the same records, median "
                              f"of {SKIP_REPEATS} ({each(raws)} us); {load_before} -> {load_average()}"))
        if befores:
            rows.append(row(f"before: CPU per skipped record, {readers} readers, only others' records",
                            statistics.median(befores) / skip_events * 1e6, "us",
                            notes=f"the worker of {before}, each drain beside one of the row above: median of "
                                  f"{SKIP_REPEATS} ({each(befores)} us)"))
    step = measure_routing_step(200_000 if quick else 2_000_000)
    rows.append(row("hash ranges: routing step alone per skipped record", step * 1e6, "us",
                    notes=f"BatchRouter.route + pass_ends on batches of 1,000 others' records; {load_average()}"))
    return rows


def handoff_rows(tmp: Path, bootstrap: str, quick: bool) -> list[dict[str, Any]]:
    """The pause of moved hash ranges on Apache Kafka, beside that of moved whole partitions."""
    rows = []
    load_before = load_average()
    handoffs = measure_handoffs(tmp, 4 if quick else 12, bootstrap, warmup=4, partitions=1, name="hr-handoff")
    n = (f"1 partition, 4 hash ranges, {len(handoffs.rescales)} rescales, {len(handoffs.pauses)} range "
         f"moves, 1,000 events/s; {load_before} -> {load_average()}")
    rows.append(row("hash ranges: moved-range pause p50", percentile(handoffs.pauses, 0.5), "s", notes=n))
    rows.append(row("hash ranges: moved-range pause p99", percentile(handoffs.pauses, 0.99), "s",
                    goal="<= 0.25 s", notes=n))
    load_before = load_average()
    whole = measure_handoffs(tmp, 4 if quick else 12, bootstrap, warmup=4, partitions=4, name="whole-handoff")
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

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_hash_range", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs")
    parser.add_argument("--skip-only", action="store_true", help="only the skip CPU rows (on Apache Kafka)")
    parser.add_argument("--before", type=Path, help="the src directory of another checkout: its worker's skip "
                        "CPU beside this one's, drain by drain")
    args = parser.parse_args()
    print(format_table(run(args.quick, skip_only=args.skip_only, before=args.before)))
