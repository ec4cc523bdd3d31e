"""What a whole `keyrange worker` spends per record, mapped against default, in instructions
(BENCHMARKS.md, "Input mapping"): counted by callgrind, so the figures hold on a loaded machine.

For each kind of topic (those of `benchmarks.mapping_cost`: `default`, keyrange's own format;
`headers`, the same records with the `event-id` header; `mapped`, as another team writes them),
all kinds at once, one `keyrange worker` (the ledger handler; the mapped one with
`bench_ledger.MAPPED_FLAGS`) runs under `valgrind --tool=callgrind` (all threads) on an empty topic.
It drains `--warmup` records first (start-up, restore, every client's first event and state);
then its counters are zeroed (`callgrind_control`) and the next `--records` records are produced;
the count is dumped when all of their offsets are committed. The records are the same ledger
commands on every topic (1,000 clients, 1 % duplicates), so every worker counts exactly the same
records: the intake, the scheduler, the handler, outputs, the committer and librdkafka's threads.

What a worker does per wall second rather than per record (polls, timers) is counted too, and under
valgrind a record takes some 50 times as long as natively, so that share is 50 times too large. The
same worker is therefore also counted idle afterwards (`--idle-seconds`), and its count per second
times the span's length is subtracted ("without the idle worker's"): an estimate, since a busy
worker's per-second work is not exactly an idle one's. For the same reason the worker commits
every second (`--commit-interval-ms`), not every 100 ms: a transaction then covers about as many
records as bench_ledger's do natively, not a handful.

`python -m benchmarks.worker_cost [--broker tansu|kafka] [--records N] [--warmup N] [--runs kind,...]
[--src DIR] [--keep DIR]` (`--keep` keeps each callgrind file for `callgrind_annotate`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from confluent_kafka import Consumer, TopicPartition

from benchmarks.bench_ledger import MAPPED_FLAGS, PARTITIONS, produce_as
from benchmarks.harness import load_average, running_broker
from benchmarks.mapping_cost import KINDS
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, Scheduled, generate

REPO = Path(__file__).resolve().parents[1]


def worker_command(bootstrap: str, topic: str, group: str, mapped: bool, commit_interval_ms: int) -> list[str]:
    """The drained worker, as `bench_ledger` runs it (the ledger handler) but for the commit interval."""
    return [sys.executable, "-m", "keyrange.cli", "worker", "--bootstrap", bootstrap, "--topic", topic,
            "--group", group, "--partitions", f"0-{PARTITIONS - 1}", "--handler", "ledger",
            "--sink-topic", f"{topic}.{group}", "--commit-interval-ms", str(commit_interval_ms),
            "--summary-seconds", "0", *(MAPPED_FLAGS if mapped else [])]


def committed(watcher: Consumer, tps: list[TopicPartition]) -> int:
    """The group's committed offsets summed (0 while the coordinator is not there yet)."""
    try:
        return sum(max(tp.offset, 0) for tp in watcher.committed(tps, timeout=30))
    except Exception:  # noqa: BLE001 - a new group's coordinator loading: nothing committed yet
        return 0


class Span(NamedTuple):
    """One worker's count."""

    instructions: int
    """Counted while the worker handled `records` records."""
    records: int
    seconds: float
    """The span's wall time under valgrind (from zeroing to dumping)."""
    idle_per_second: float
    """Instructions per wall second of the same worker idle after the drain (module docstring)."""

    def per_record(self, idle_corrected: bool) -> float:
        """Instructions per record, without the idle worker's share of the span if `idle_corrected`."""
        idle = self.idle_per_second * self.seconds if idle_corrected else 0.0
        return (self.instructions - idle) / self.records


def _dumped(directory: Path, keep: Path | None, name: str) -> int:
    """The instructions of the one dump `callgrind_control --dump` wrote into `directory` (then removed)."""
    dumps = sorted(directory.glob("callgrind.out.*"))
    if len(dumps) != 1:
        raise RuntimeError(f"callgrind wrote {len(dumps)} dumps, expected one")
    text = dumps[0].read_text()
    if keep is not None:
        shutil.copy(dumps[0], keep / name)
    dumps[0].unlink()
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError("callgrind's dump has no summary")
    return int(found.group(1))



def count_worker(bootstrap: str, kind: str, records: list[Scheduled], warmup: int, args: argparse.Namespace
                 ) -> Span:
    """A worker drains `records` from an empty topic of `kind` under callgrind; the records after
    the first `warmup` are counted (module docstring)."""
    topic, group = f"worker-cost-{time.monotonic_ns()}-{kind}", f"cost-{kind}"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS), TopicSpec(f"{topic}.{group}", PARTITIONS)],
                  timeout_seconds=60)
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": f"{args.src}{os.pathsep}{REPO}", "PYTHONHASHSEED": "0",
               "PYTHONMALLOC": "malloc"}
        process = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out",
                                    *worker_command(bootstrap, topic, group, kind == "mapped",
                                                    args.commit_interval_ms)],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def control(action: str) -> None:
            subprocess.run(["callgrind_control", action, str(process.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)

        def drained(count: int) -> None:
            deadline = time.monotonic() + 3600
            while committed(watcher, tps) < count:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the worker on {topic} stopped or stalled before {count:,} committed")
                time.sleep(0.1)

        try:
            produce_as(kind, bootstrap, topic, records[:warmup])
            drained(warmup)
            control("--zero")
            started = time.monotonic()
            produce_as(kind, bootstrap, topic, records[warmup:])
            drained(len(records))
            control("--dump")
            seconds = time.monotonic() - started
            span = _dumped(Path(tmp), args.keep, f"{kind}.callgrind")
            control("--zero")
            idle_started = time.monotonic()
            time.sleep(args.idle_seconds)
            control("--dump")
            idle = _dumped(Path(tmp), args.keep, f"{kind}-idle.callgrind") / (time.monotonic() - idle_started)
        finally:
            process.terminate()
            process.wait(600)
            watcher.close()
    return Span(span, len(records) - warmup, seconds, idle)


def main() -> None:
    """Produce the topics, count each kind's span, print instructions per record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="tansu", choices=("tansu", "kafka"))
    parser.add_argument("--records", type=int, default=20_000, help="records counted")
    parser.add_argument("--warmup", type=int, default=2_000, help="records drained before counting")
    parser.add_argument("--runs", default="default,mapped", help="kinds to count, comma-separated")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the keyrange sources counted (a src dir)")
    parser.add_argument("--keep", type=Path, help="a directory to keep each span's callgrind file in")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="how long the idle worker is counted")
    parser.add_argument("--commit-interval-ms", type=int, default=1000,
                        help="the worker's (bench_ledger's 100 ms, times about valgrind's slowdown: module docstring)")
    args = parser.parse_args()
    kinds = args.runs.split(",")
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"unknown kind {kind!r}; choose from {KINDS}")
    records = list(generate(LoadShape(clients=1000, duplicate_ratio=0.01, ledger=True, seed=21),
                            count=args.warmup + args.records))
    with running_broker(args.broker) as bootstrap, ThreadPoolExecutor(len(kinds)) as pool:
        # At once: the machine's load then slows every worker alike, so each span lasts about as long.
        spans = pool.map(lambda kind: count_worker(bootstrap, kind, records, args.warmup, args), kinds)
        for kind, span in zip(kinds, spans, strict=True):
            print(f"worker {kind:8} {span.per_record(False):10,.0f} instructions/record, "
                  f"{span.per_record(True):10,.0f} without the idle worker's ({span.instructions:,} over "
                  f"{span.records:,} records in {span.seconds:.0f} s; idle {span.idle_per_second:,.0f}/s; "
                  f"{load_average()})", flush=True)

if __name__ == "__main__":
    main()
