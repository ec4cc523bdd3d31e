"""A tiny shared harness for `python -m benchmarks`: result rows, percentiles, a raw baseline.

Each benchmark module exposes `run(quick: bool) -> list[dict]`; a row is
{"name", "value", "unit", "goal", "baseline", "ratio", "notes"}.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.local.kafka_cluster import KafkaCluster
from keyrange.local.supervisor import Supervisor
from keyrange.worker.stats import percentile

__all__ = [
    "BROKERS",
    "can_place_apart",
    "cores_apart",
    "load_average",
    "percentile",
    "pid_cpu_seconds",
    "process_cpu_seconds",
    "raw_consume_rate",
    "row",
    "running_broker",
    "running_broker_processes",
    "wait_until",
]

BROKERS = ("kafka", "tansu")
"""The brokers a benchmark can run on: Apache Kafka (the reference, one KRaft node) and tansu."""


@contextlib.contextmanager
def running_broker(engine: str) -> Iterator[str]:
    """Start a broker for one benchmark and yield its bootstrap address: `kafka` (Apache Kafka 4,
    one KRaft node with the full JIT, as `keyrange broker --engine kafka` runs it) or `tansu` (the
    embedded broker)."""
    with running_broker_processes(engine) as (bootstrap, _):
        yield bootstrap


@contextlib.contextmanager
def ticking(supervisor: Supervisor) -> Iterator[threading.Event]:
    """Start `supervisor` and tick it as `keyrange run`'s main loop does; yield the event that stops
    the ticks (a load fed alongside can share it); on exit set it and stop the supervisor."""
    stop = threading.Event()
    supervisor.start()

    def tick() -> None:
        while not stop.wait(supervisor.tick_seconds):
            supervisor.tick()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield stop
    finally:
        stop.set()
        ticker.join(10)
        supervisor.stop()


@contextlib.contextmanager
def running_broker_processes(engine: str) -> Iterator[tuple[str, list[int]]]:
    """`running_broker`, also yielding the broker's process ids (Kafka's JVMs; none for tansu)."""
    if engine not in BROKERS:
        raise ValueError(f"unknown broker {engine!r}; choose one of {BROKERS}")
    if engine == "kafka":
        with KafkaCluster(nodes=1) as cluster:
            yield cluster.bootstrap, [pid for node in cluster.members if (pid := node.pid) is not None]
    else:
        with EmbeddedBroker() as broker:
            yield broker.bootstrap, []


def _set_cpus(pid: int, cpus: set[int]) -> None:
    """Move every thread of process `pid` to `cpus` (affinity is per thread; new threads inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def can_place_apart(broker_pids: list[int]) -> bool:
    """Whether `cores_apart` can run: a broker process to move and 2 cores to spread over."""
    return bool(broker_pids) and len(os.sched_getaffinity(0)) >= 2


@contextlib.contextmanager
def cores_apart(broker_pids: list[int]) -> Iterator[str]:
    """Within: the broker's threads on one core and this process, with what it starts from here on
    (the worker, the raw loop), on another, as when the brokers run on machines of their own.
    Yields a description of the layout; needs two cores."""
    everything = os.sched_getaffinity(0)
    if not can_place_apart(broker_pids):
        raise RuntimeError("placing the broker and the worker on separate cores needs 2 cores and a broker process")
    broker_core, worker_core = sorted(everything)[:2]
    for pid in broker_pids:
        _set_cpus(pid, {broker_core})
    _set_cpus(os.getpid(), {worker_core})
    try:
        yield f"broker on CPU {broker_core}, worker or raw loop on CPU {worker_core}"
    finally:
        _set_cpus(os.getpid(), everything)
        for pid in broker_pids:
            with contextlib.suppress(FileNotFoundError):
                _set_cpus(pid, everything)


def wait_until(condition: Callable[[], object], timeout_seconds: float) -> bool:
    """Poll `condition` every 20 ms until it is true (True) or `timeout_seconds` pass (False)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def load_average() -> str:
    """The machine's 1/5/15-minute load averages, recorded beside every figure (the cores are shared)."""
    return "load {:.1f}/{:.1f}/{:.1f}".format(*os.getloadavg())


def process_cpu_seconds(process: subprocess.Popen[Any]) -> float:
    """User + system CPU seconds a child process has used so far (all its threads), from /proc."""
    return pid_cpu_seconds(process.pid)


def pid_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_peak_rss_mib(process: subprocess.Popen[Any]) -> float:
    """The highest resident memory a running child process has had so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{process.pid}/status has no VmHWM line")


def row(name: str, value: float, unit: str, goal: str | None = None, baseline: float | None = None,
        notes: str = "", broker: str = "") -> dict[str, Any]:
    """One result row; `ratio` is value / baseline when there is a baseline."""
    ratio = value / baseline if baseline else None
    return {"name": name, "value": value, "unit": unit, "goal": goal, "baseline": baseline,
            "ratio": ratio, "notes": notes, "broker": broker}


def raw_consume_rate(bootstrap: str, topic: str, partitions: int, expect: int, timeout_seconds: float = 120.0) -> float:
    """Records/s of a plain confluent-kafka consume loop reading `expect` records from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed", "log_level": 3})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen = 0
        started = None
        deadline = time.monotonic() + timeout_seconds
        while seen < expect and time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.1)
            if batch and started is None:
                started = time.monotonic()
            seen += sum(1 for m in batch if m.error() is None)
        if started is None:
            return 0.0
        return seen / max(time.monotonic() - started, 1e-9)
    finally:
        consumer.close()


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned text table."""
    header = ("benchmark", "broker", "value", "unit", "goal", "baseline", "ratio", "notes")
    lines = [header]
    for r in rows:
        lines.append((
            r["name"], r.get("broker") or "", _num(r["value"]), r["unit"], r.get("goal") or "", _num(r.get("baseline")),
            _num(r.get("ratio")), r.get("notes") or "",
        ))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + str(line[-1])
        for line in lines
    )


def _num(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def quick_from_command_line(prog: str, doc: str | None) -> bool:
    """`--quick` of a benchmark module run on its own (`python -m benchmarks.<module>`): `--help`
    prints `doc` and exits, and any other argument is an error, not a full run of several minutes."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc)
    parser.add_argument("--quick", action="store_true", help="a short run")
    return bool(parser.parse_args().quick)
