"""A soak of `keyrange run` on its embedded broker: latency per minute, and lag that reads 0 while events wait.

Runs the real CLI, `keyrange run -f examples/streamconsumer.yaml --produce RATE` (the kata's consumer:
12 partitions, `sleep` 10 ms, 1-4 workers) with no bootstrap servers, so on its embedded broker
(Apache Kafka where Java is installed, else tansu; `--engine kafka|tansu` picks one, `--bootstrap B` a
fresh broker of your own instead, for the comparison), for the given minutes, and watches it from outside:

- a reader of its own (no group commits) follows the input topic and the processed topic from the
  start, so it knows each event's partition, `created` and `startedAt` (handler start);
- once a second it scrapes every worker's /metrics (the ports the workers listen on, found under
  /proc) for the lag each reports per partition (`keyrange_consumer_lag`).

An event *waits* at time t when the soak's reader had received it from the broker (so it was in the log,
fetchable) at least `--wait` seconds (2) before t, and its handler had not started by t: 2 s is what a
worker's lag gauge may trail the log by (it is refreshed every second, with the broker's ListOffsets
answer of the refresh before). A partition's lag *reads 0 while events wait* at a scrape t when some
worker reported the partition with lag 0 and one of its events waited at t. Apart: a partition no
worker reported at t (a handoff), "unreported"; and lag 0 while an event created `--wait` s before t was
not in the log yet, or for less than `--wait` s ("transit": mostly the producer's queue and the broker's
append, which no consumer's lag can show). A scrape is judged once the reader has read an event
created or handled 20 s after it (`JUDGE_AFTER_MS`), so an event read late is not taken for one
waiting, and a halt, where nothing is handled, is judged too.

Per minute (of handler start): events handled, latency (created -> handler start) p50/p99/max, the
delivery delay p99 (created -> the soak's reader received it), the largest total lag the workers
reported, the most partitions with an event waiting, the partition-scrapes where lag read 0 while
events waited, workers running, and the machine's 1-minute load average (`uptime`'s first figure:
the machine may be shared). `make soak` runs it for SOAK_MINUTES (60).

    python -m benchmarks.soak_embedded --minutes 60 [--rate 1000] [--engine kafka|tansu] [--out soak.json]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson
from confluent_kafka import Consumer, TopicPartition

from keyrange.autoscale.scrape import parse_metrics
from keyrange.kafkaclients import KafkaClients
from keyrange.spec import load_file
from keyrange.worker.stats import percentiles

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "streamconsumer.yaml"
JUDGE_AFTER_MS = 20_000
"""A scrape at t is judged once the reader saw an event handled this long after t."""
REMEMBER_MS = 300_000
"""How long a handled uuid is remembered (duplicates come up to 5 s after their original)."""


@dataclass
class Minute:
    """What one minute of the soak showed."""

    handled: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    lag_max: int = 0
    waiting_max: int = 0
    """The most partitions with an event waiting at one scrape."""
    scrapes: int = 0
    lag_zero_waiting: int = 0
    """Partition-scrapes where a worker reported lag 0 while an event of the partition waited."""
    unreported_waiting: int = 0
    """Partition-scrapes where no worker reported the partition while an event of it waited."""
    transit: int = 0
    """Partition-scrapes with lag 0 while an event was `wait` old and not `wait` in the log yet."""
    delivery_ms: list[float] = field(default_factory=list)
    workers: int = 0
    load1: float = 0.0


class Watch:
    """Events as the soak's reader saw them, and the workers' reported lag per scrape."""

    def __init__(self, wait_ms: int, start_ms: int) -> None:
        self.wait_ms = wait_ms
        self.start_ms = start_ms
        self.lock = threading.Lock()
        self.pending: dict[str, tuple[int, int]] = {}
        """uuid -> (partition, time it waits from) of events read from the input and not seen handled."""
        self.order: dict[int, deque[str]] = {}
        """Per partition, the pending uuids in the order read (lazily pruned)."""
        self.handled: dict[str, int] = {}
        """uuid -> handler start, for REMEMBER_MS."""
        self.handled_order: deque[tuple[int, str]] = deque()
        self.early: dict[str, tuple[int, int]] = {}
        """uuid -> (created, startedAt) of events read handled before read from the input."""
        self.waits: dict[int, list[list[int]]] = {}
        """Per partition, merged intervals [waits from, startedAt) when some event waited."""
        self.transits: dict[int, list[list[int]]] = {}
        """Per partition, merged intervals [created + wait, received + wait) when an event was in transit."""
        self.newest_read = 0
        """The latest `created` or handler start among the records read: how far the reader has come."""
        self.samples: deque[tuple[int, dict[int, int], int, float]] = deque()
        """(t, {partition: reported lag}, workers, load1) not judged yet."""
        self.minutes: dict[int, Minute] = {}
        self.rows: dict[int, dict[str, Any]] = {}
        """Rows of the minutes printed (their latencies are dropped then)."""

    def minute(self, t_ms: int) -> Minute:
        """The minute (from the start) `t_ms` falls in."""
        return self.minutes.setdefault(max(0, (t_ms - self.start_ms) // 60_000), Minute())

    def on_input(self, uuid: str, partition: int, created: int, received: int) -> None:
        """An input record read at `received`."""
        with self.lock:
            self.newest_read = max(self.newest_read, created)  # the input goes on while nothing is handled
            early = self.early.pop(uuid, None)
            if early is None and (uuid in self.pending or uuid in self.handled):
                return  # a duplicate
            self.minute(received).delivery_ms.append(received - created)
            in_log = max(created, received) + self.wait_ms
            if early is not None:
                _, started = early
                _extend(self.transits, partition, created + self.wait_ms, min(in_log, started))
                _extend(self.waits, partition, in_log, started)
                return
            _extend(self.transits, partition, created + self.wait_ms, in_log)
            self.pending[uuid] = (partition, in_log)
            self.order.setdefault(partition, deque()).append(uuid)

    def on_processed(self, uuid: str, created: int, started: int) -> None:
        """A processed record read."""
        with self.lock:
            self.newest_read = max(self.newest_read, started)
            m = self.minute(started)
            m.handled += 1
            m.latencies_ms.append(started - created)
            self.handled[uuid] = started
            self.handled_order.append((started, uuid))
            while self.handled_order and self.handled_order[0][0] < started - REMEMBER_MS:
                self.handled.pop(self.handled_order.popleft()[1], None)
            got = self.pending.pop(uuid, None)
            if got is None:
                self.early[uuid] = (created, started)
            else:
                _extend(self.waits, got[0], got[1], started)

    def on_scrape(self, t_ms: int, lag: dict[int, int], workers: int, load1: float) -> None:
        """One scrape of every worker: the lag each partition was reported with."""
        with self.lock:
            self.samples.append((t_ms, lag, workers, load1))
            m = self.minute(t_ms)
            m.lag_max = max(m.lag_max, sum(lag.values()))
            m.workers = max(m.workers, workers)
            m.load1 = max(m.load1, load1)

    def judge(self) -> None:
        """Judge the scrapes the reader has read far enough past."""
        with self.lock:
            while self.samples and self.samples[0][0] + JUDGE_AFTER_MS <= self.newest_read:
                t, lag, _, _ = self.samples.popleft()
                self._judge_one(t, lag)

    def _judge_one(self, t: int, lag: dict[int, int]) -> None:
        m = self.minute(t)
        m.scrapes += 1
        waiting_total = 0
        for partition in set(self.order) | set(self.waits) | set(self.transits):
            if self._waiting(partition, t):
                waiting_total += 1
                if partition not in lag:
                    m.unreported_waiting += 1
                elif lag[partition] == 0:
                    m.lag_zero_waiting += 1
            elif lag.get(partition) == 0 and _covers(self.transits.get(partition, []), t):
                m.transit += 1
        m.waiting_max = max(m.waiting_max, waiting_total)
        for spans in (*self.waits.values(), *self.transits.values()):
            while spans and spans[0][1] < t - JUDGE_AFTER_MS:
                spans.pop(0)

    def _waiting(self, partition: int, t: int) -> bool:
        """Whether an event of the partition waited at t: one still unhandled, or handled later."""
        order = self.order.get(partition, deque())
        while order and order[0] not in self.pending:
            order.popleft()
        if order and self.pending[order[0]][1] <= t:
            return True
        return _covers(self.waits.get(partition, []), t)


def _extend(spans_of: dict[int, list[list[int]]], partition: int, start: int, end: int) -> None:
    """Add [start, end) to the partition's merged intervals (they come roughly in order)."""
    if end <= start:
        return
    spans = spans_of.setdefault(partition, [])
    if spans and start <= spans[-1][1]:
        spans[-1][0] = min(spans[-1][0], start)
        spans[-1][1] = max(spans[-1][1], end)
    else:
        spans.append([start, end])


def _covers(spans: list[list[int]], t: int) -> bool:
    i = bisect.bisect_right([s[0] for s in spans], t)
    return bool(i) and spans[i - 1][1] > t


def _read(bootstrap: str, topic: str, sink: str, partitions: int, watch: Watch, stop: threading.Event) -> None:
    consumer = Consumer(KafkaClients(bootstrap).consumer(f"soak-reader-{time.time_ns()}", {"log_level": 0}))
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)]
                        + [TopicPartition(sink, p, 0) for p in range(partitions)])
        while not stop.is_set():
            for msg in consumer.consume(2000, 0.5):
                if msg.error() is not None or msg.value() is None:
                    continue
                v = orjson.loads(msg.value() or b"{}")
                if msg.topic() == topic:
                    watch.on_input(v["uuid"], int(msg.partition() or 0), int(v["created"]), int(time.time() * 1000))
                else:
                    watch.on_processed(v["uuid"], int(v["created"]), int(v["startedAt"]))
    finally:
        consumer.close()


def _children(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        found += kids
        frontier += kids
    return found


def worker_metrics_urls(root: int) -> list[str]:
    """The /metrics URLs of the `keyrange worker` processes under `root` (their --metrics-fd socket's port)."""
    urls = []
    for pid in _children(root):
        with contextlib.suppress(OSError, ValueError, IndexError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if "worker" not in args or "--metrics-fd" not in args:
                continue
            fd = args[args.index("--metrics-fd") + 1]
            inode = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
            if inode is None:
                continue
            for table in ("tcp", "tcp6"):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    cols = line.split()
                    if cols[9] == inode.group(1):
                        urls.append(f"http://127.0.0.1:{int(cols[1].rsplit(':', 1)[1], 16)}/metrics")
    return urls


def _scrape(urls: list[str]) -> dict[int, int]:
    lag: dict[int, int] = {}
    for url in urls:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(url, timeout=2) as r:
                sample = parse_metrics(r.read().decode(), time.time())
            for slot, slot_lag in sample.slot_lag.items():
                lag[slot] = max(lag.get(slot, 0), slot_lag.records)
    return lag


def _load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _row(index: int, m: Minute) -> dict[str, Any]:
    p50, p99, top = percentiles(m.latencies_ms, 0.5, 0.99, 1.0) if m.latencies_ms else (None, None, None)
    return {
        "minute": index + 1, "handled": m.handled, "p50_ms": p50, "p99_ms": p99, "max_ms": top,
        "delivery_p99_ms": percentiles(m.delivery_ms, 0.99)[0] if m.delivery_ms else None,
        "lag_max": m.lag_max, "waiting_max": m.waiting_max, "transit": m.transit,
        "scrapes": m.scrapes, "lag_zero_waiting": m.lag_zero_waiting, "unreported_waiting": m.unreported_waiting,
        "workers": m.workers, "load1": m.load1,
    }


def _print_row(r: dict[str, Any], out: TextIO) -> None:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    print(f"{r['minute']:>6} {r['handled']:>8,} {ms(r['p50_ms']):>8} {ms(r['p99_ms']):>8} {ms(r['max_ms']):>8} "
          f"{ms(r['delivery_p99_ms']):>8} {r['lag_max']:>8,} {r['waiting_max']:>6,} {r['scrapes']:>7} "
          f"{r['lag_zero_waiting']:>6} {r['unreported_waiting']:>6} {r['transit']:>7} {r['workers']:>7} "
          f"{r['load1']:>6.1f}", file=out, flush=True)


HEADER = (f"{'minute':>6} {'handled':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'deliv99':>8} {'lag max':>8} "
          f"{'waitp':>6} {'scrapes':>7} {'lag0w':>6} {'unrep':>6} {'transit':>7} {'workers':>7} {'load1':>6}")


@dataclass
class SoakResult:
    """The soak's per-minute rows and totals."""

    rows: list[dict[str, Any]]
    produced_line: str
    exit_code: int

    @property
    def lag_zero_waiting(self) -> int:
        """Partition-scrapes where lag read 0 while an event of the partition waited."""
        return sum(r["lag_zero_waiting"] for r in self.rows)


def run_soak(minutes: float, rate: float, out: TextIO, log_path: Path, wait_seconds: float = 2.0,
             spec: Path = SPEC, bootstrap: str | None = None, engine: str | None = None) -> SoakResult:
    """Run `keyrange run --produce RATE` on its embedded broker (`engine`, default keyrange run's; or on
    `bootstrap`, a fresh broker for the comparison) for `minutes`; print a row per minute."""
    start_ms = int(time.time() * 1000)
    watch = Watch(int(wait_seconds * 1000), start_ms)
    with open(log_path, "w") as log:
        run_dir = log_path.with_suffix(".run")
        proc = subprocess.Popen(
            [sys.executable, "-m", "keyrange.cli", "run", "-f", str(spec), "--produce", str(rate),
             "--duration", str(minutes * 60), "--run-dir", str(run_dir),
             *(["--bootstrap", bootstrap] if bootstrap else []), *(["--engine", engine] if engine else [])],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        try:
            title = f"keyrange run -f {spec.relative_to(ROOT)} --produce {rate:g} for {minutes:g} min"
            return _watch_run(proc, log, watch, out, spec, title)
        finally:
            if proc.poll() is None:
                proc.terminate()  # it stops its workers and its broker
                proc.wait(60)


def _copy(stream: TextIO, log: TextIO, lines: list[str]) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        lines.append(line)


def _watch_run(proc: subprocess.Popen[str], log: TextIO, watch: Watch, out: TextIO, spec: Path,
               title: str) -> SoakResult:
    """Follow the run's topics and scrape its workers once a second until it exits."""
    consumer = load_file(spec)
    topic, sink, partitions = consumer.spec.kafka.topic, consumer.spec.sink_topic, consumer.spec.kafka.partitions
    stop = threading.Event()
    assert proc.stdout is not None
    bootstrap = None
    for line in proc.stdout:
        log.write(line)
        found = re.search(r"broker (\S+),", line)
        if found:
            bootstrap = found.group(1)
            break
    if bootstrap is None:
        raise RuntimeError(f"keyrange run printed no broker address; see {log.name}")
    lines: list[str] = []
    threading.Thread(target=_copy, args=(proc.stdout, log, lines), daemon=True).start()
    reader = threading.Thread(target=_read, args=(bootstrap, topic, sink, partitions, watch, stop), daemon=True)
    reader.start()
    print(f"soak: {title} on the broker at {bootstrap}; an event waits from {watch.wait_ms / 1000:g} s "
          "after it reached the log until its handler starts", file=out, flush=True)
    print(HEADER, file=out, flush=True)
    urls: list[str] = []
    printed = 0
    while proc.poll() is None:
        t0 = time.monotonic()
        if not urls or int(t0) % 5 == 0:
            urls = worker_metrics_urls(proc.pid)
        watch.on_scrape(int(time.time() * 1000), _scrape(urls), len(urls), _load1())
        watch.judge()
        printed = _print_done(watch, printed, out)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    stop.set()  # the broker went with the run: the scrapes of its last seconds stay unjudged
    reader.join(10)
    rows = [watch.rows.get(i) or _row(i, watch.minutes[i]) for i in sorted(watch.minutes)]
    for r in rows[printed:]:
        _print_row(r, out)
    produced = next((x.strip() for x in reversed(lines) if x.strip().startswith("produced")), "")
    return SoakResult(rows, produced, proc.returncode)


def _print_done(watch: Watch, printed: int, out: TextIO) -> int:
    """Print the minutes both handled and judged (two minutes back), once each."""
    with watch.lock:
        current = (int(time.time() * 1000) - watch.start_ms) // 60_000
        while printed < current - 1 and printed in watch.minutes:
            watch.rows[printed] = _row(printed, watch.minutes[printed])
            watch.minutes[printed].latencies_ms.clear()
            watch.minutes[printed].delivery_ms.clear()
            _print_row(watch.rows[printed], out)
            printed += 1
    return printed


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.soak_embedded`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=1000.0, help="events/s (default: the kata's 1000)")
    p.add_argument("--wait", type=float, default=2.0, help="seconds unstarted after which an event waits")
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    p.add_argument("--log", type=Path, default=Path("soak-run.log"), help="keyrange run's output")
    p.add_argument("--bootstrap", help="a fresh broker to compare with (e.g. `keyrange broker --engine kafka`); "
                                       "default: the embedded one")
    p.add_argument("--engine", choices=("kafka", "tansu"),
                   help="the embedded broker (default: keyrange run's, Apache Kafka where Java is installed)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds run_soak, which stops `keyrange run`
    result = run_soak(args.minutes, args.rate, sys.stdout, args.log, args.wait, bootstrap=args.bootstrap,
                      engine=args.engine)
    print(f"lag read 0 while events waited: {result.lag_zero_waiting} partition-scrapes; {result.produced_line}",
          flush=True)
    if args.out:
        args.out.write_text(json.dumps(result.rows, indent=1))
    return 0 if result.lag_zero_waiting == 0 and result.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
