"""A StreamConsumer under load, for fault tests (broker faults on a 3-node Kafka cluster, a slot's
producer fenced under a worker).

`keyrange run`'s Supervisor runs in the test process against the brokers: the range controller,
two `keyrange worker` subprocesses in controlled mode (restarted when they die, as `keyrange run`
does), a paced ledger load with duplicates. A test starts it, does its fault to the brokers while
the load runs, and `finish` stops the load, waits until every event is handled and checks every
guarantee: no loss, no duplicate handling, per-client order, the ledger oracle and the exact
committed totals (and that every `poison` record was dead-lettered).

Flow across a fault is measured from the supervisor's ticks: the events the workers report
committed (`committed_between`, `longest_stall`), since a handled event whose transaction aborts
is not yet an output anyone can read.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from keyrange.events import DLQ_REASON
from keyrange.loadgen import LoadShape
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file
from tests.checkers import Counts, LoggedEvent, check_all
from tests.kafkatools import read_counts, read_processed, read_topic

PARTITIONS = 6
RATE = 400
"""Events per second: enough that every fault lands mid-stream, little enough for 2 shared cores."""

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: faults}}
spec:
  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: {partitions}}}
  handler: ledger
  handlerConfig: {handler_config}
  concurrency: 16
  dedup: {{ttlSeconds: 120}}
  workers: {{min: 2, max: 2}}
  scaling: {{lagHighRecords: 1000000000, lagHighSeconds: 100000, lagLowRecords: 0, cooldownSeconds: 0}}
"""
"""Two workers, no rescaling: the faults here are the brokers'. The dedup TTL outlasts any fault, so
every duplicate of the load must be dropped however long a fault stalls the workers."""

QUEUED = "{delayMs: 1}"
"""The ledger as a coroutine that sleeps 1 ms first: events wait in their clients' queues and up to
`concurrency` run at once."""
INLINE = "{}"
"""The ledger as it ships: an `@inline` handler, run on the worker's loop as its event is admitted
(docs/worker.md); a transaction then holds whole fetches at once."""


def wait_until(condition: Callable[[], bool], what: str, timeout_seconds: float = 120.0) -> None:
    """Poll `condition` until true; fail naming `what`."""
    began = time.monotonic()
    deadline = began + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}")
        time.sleep(0.1)
    print(f"{time.strftime('%H:%M:%S')} {what}: {time.monotonic() - began:.1f} s")


@dataclass(frozen=True)
class Outcome:
    """What a run handled, for the test's own checks beyond the guarantees."""

    records: int
    processed: list[Mapping[str, Any]]
    restarts: int
    """Times a worker process was restarted after it exited."""
    dead_letter_reasons: list[str]


class WorkerExitedOnTransactionError(AssertionError):
    """A worker process exited because a slot's transactional producer failed during a broker
    fault, and was restarted (the guarantees may have held: the restart resumed from the committed
    offsets). It must not: a slot whose producer was fenced (the coordinator aborted a transaction
    a fault held too long) or given up (a send_offsets_to_transaction librdkafka never answers) is
    released without committing and acquired again in place (worker/engine.py SlotFailure)."""


TRANSACTIONAL_EXIT_MARKS = ("TransactionFailed", "KafkaException: KafkaError{")
"""How a worker's log names an exit of its transactional producer (see the class above)."""


def worker_exit_reasons(log_dir: Path) -> list[str]:
    """The exception lines (not indented) of every traceback in the workers' logs."""
    reasons = []
    for log_file in sorted(log_dir.glob("worker-*.log")):
        lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
        reasons += [f"{log_file.name}: {line}" for line in lines
                    if line and not line[0].isspace() and line.split(":", 1)[0].endswith(("Error", "Exception",
                                                                                          "Failed"))]
    return reasons


def check_workers_rode_it_out(outcome: Outcome, log_dir: Path, deliberate: int = 0) -> None:
    """No worker process exited besides the `deliberate` kills: an exit of a transactional producer
    fails with `WorkerExitedOnTransactionError`, any other exit with its traceback's reasons."""
    if outcome.restarts <= deliberate:
        return
    reasons = worker_exit_reasons(log_dir)
    others = [r for r in reasons if not any(mark in r for mark in TRANSACTIONAL_EXIT_MARKS)]
    assert reasons and not others, (f"{outcome.restarts - deliberate} worker exit(s) during the fault: "
                                    f"{others or 'no traceback in the logs'}")
    raise WorkerExitedOnTransactionError(f"{outcome.restarts - deliberate} worker exit(s): {reasons[:4]}")


class FaultRun:
    """One StreamConsumer with two workers and a paced load against `bootstrap` (module docstring)."""

    def __init__(self, bootstrap: str, topic: str, workdir: Path, handler_config: str = QUEUED) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.group = f"{topic}-g"
        self.log_dir = workdir / "run" / "logs"
        """The worker processes' logs (`worker-<n>.log`)."""
        spec_file = workdir / "consumer.yaml"
        spec_file.write_text(SPEC.format(topic=topic, partitions=PARTITIONS, handler_config=handler_config))
        self.supervisor = Supervisor(load_file(spec_file), spec_file, bootstrap, workdir / "run",
                                     tick_seconds=0.5)
        self.totals = LoadTotals()
        self._stop_load = threading.Event()
        self._stop_ticks = threading.Event()
        self._failures: list[BaseException] = []
        self._threads: list[threading.Thread] = []
        self._load: threading.Thread | None = None
        self.poisoned = 0
        """Records sent by `poison`: not JSON, so the workers dead-letter them."""

    def start(self) -> None:
        """Start the controller and the workers, wait until they hold every slot, start the load."""
        self.supervisor.start()
        self._spawn(self._tick)
        wait_until(self._all_slots_held, "the two workers to hold every slot")
        shape = LoadShape(rate=RATE, clients=150, duplicate_ratio=0.05, ledger=True, seed=13)
        self._load = self._spawn(produce_phases, self.bootstrap, self.topic, shape, [Phase(600, RATE)],
                                 self._stop_load, self.totals)

    def _spawn(self, target: Callable[..., Any], *args: Any) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:
                self._failures.append(exc)
                raise

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _tick(self) -> None:  # what `keyrange run`'s main loop does
        while not self._stop_ticks.wait(self.supervisor.tick_seconds):
            self.supervisor.tick()

    def _all_slots_held(self) -> bool:
        assert self.supervisor.controller is not None
        reports = self.supervisor.controller.channel.state.reports
        return set().union(*(r.held for r in reports.values())) == set(range(PARTITIONS))

    def poison(self, count: int) -> None:
        """Send `count` records that are not JSON: each must reach the dead-letter topic."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "log_level": 0})
        for i in range(count):
            producer.produce(self.topic, b"not json", str(1000 + i).encode())
        assert producer.flush(60) == 0, "poison records not acknowledged"
        self.poisoned += count

    def handled(self) -> int:
        """Events handled so far, as the workers report them (restarted workers count from 0)."""
        return self.supervisor.history[-1].processed if self.supervisor.history else 0

    def wait_handled(self, more: int, what: str, timeout_seconds: float = 120.0) -> None:
        """Wait until the workers have handled `more` events beyond what they had handled now."""
        target = self.handled() + more
        wait_until(lambda: self.handled() >= target, f"{more} more events handled {what}", timeout_seconds)

    def finish(self, timeout_seconds: float = 90.0) -> Outcome:
        """Stop the load; wait for every event to be handled; check every guarantee; stop."""
        try:
            self._stop_load.set()
            assert self._load is not None, "not started"
            self._load.join(60)
            assert not self._failures, f"the load or the supervisor failed: {self._failures[0]!r}"
            bootstrap = self.bootstrap
            log, poison = self._read_input(self.totals.sent + self.poisoned)
            assert len(log) == self.totals.sent, f"{self.totals.sent} events sent, {len(log)} in the log"
            assert poison == self.poisoned, f"{self.poisoned} poison records sent, {poison} in the log"
            distinct = len({e.uuid for e in log})
            processed = read_processed(bootstrap, f"{self.topic}.processed", distinct,
                                       timeout_seconds=timeout_seconds)
            counts = read_counts(bootstrap, self.topic, self.group, covering=len(log) + poison)
            dead = read_topic(bootstrap, f"{self.topic}.dlq", poison)
            assert self.supervisor.fleet is not None
            restarts = sum(w.restarts for w in self.supervisor.fleet.workers.values())
        finally:
            self.stop()
        reasons = [dict(m.headers())[DLQ_REASON].decode() for m in dead]
        assert reasons == ["not-json"] * poison, f"dead letters: {reasons}"
        assert counts.dead_lettered == poison
        # The poison records are not events of the log: take them out of the accounting.
        check_all(log, list(processed), Counts(counts.handled, 0, counts.duplicates_dropped), ledger=True)
        assert len(processed) == distinct
        return Outcome(len(log), list(processed), restarts, reasons)

    def _read_input(self, expect: int) -> tuple[list[LoggedEvent], int]:
        """The input topic's events, and how many records in it are not JSON (`poison`)."""
        events, poison = [], 0
        for m in read_topic(self.bootstrap, self.topic, expect):
            try:
                body = orjson.loads(m.value())
            except orjson.JSONDecodeError:
                poison += 1
                continue
            events.append(LoggedEvent(m.partition(), m.offset(), body["clientId"], body["uuid"], body))
        return events, poison

    def stop(self) -> None:
        """Stop the load, the ticks, the workers and the controller (idempotent)."""
        self._stop_load.set()
        self._stop_ticks.set()
        for thread in self._threads:
            thread.join(60)
        self.supervisor.stop()


def now_ms() -> int:
    """Wall-clock epoch ms, the clock of the processed records' startedAt/finishedAt."""
    return int(time.time() * 1000)


def handled_between(processed: list[Mapping[str, Any]], since_ms: int, until_ms: int) -> int:
    """How many events finished handling between the two wall-clock times (epoch ms)."""
    return sum(1 for r in processed if since_ms <= r["finishedAt"] <= until_ms)


@dataclass(frozen=True)
class Stall:
    """The longest time without a newly committed event within a window, from the window's start."""

    began_s: float
    ended_s: float

    @property
    def seconds(self) -> float:
        return self.ended_s - self.began_s


def committed_timeline(run: FaultRun) -> list[tuple[int, int]]:
    """(epoch ms, events committed so far) at every supervisor tick: what the workers' metrics
    counted as committed (a handled event counts once its transaction commits)."""
    return [(p.at_ms, p.processed) for p in run.supervisor.history]


def committed_between(run: FaultRun, since_ms: int, until_ms: int) -> int:
    """Events committed between the two times, by the supervisor's ticks."""
    timeline = committed_timeline(run)
    before = max((n for at, n in timeline if at <= since_ms), default=0)
    return max((n for at, n in timeline if at <= until_ms), default=0) - before


def longest_stall(timeline: list[tuple[int, int]], since_ms: int, until_ms: int) -> Stall:
    """The longest stretch of ticks in [since_ms, until_ms] over which the committed count did
    not grow (resolution: one tick); the window's ends count as growth."""
    points = [(at, n) for at, n in timeline if since_ms <= at <= until_ms]
    grew = [since_ms, *(b_at for (_, a_n), (b_at, b_n) in itertools.pairwise(points) if b_n > a_n), until_ms]
    gap, start = max((b - a, a) for a, b in itertools.pairwise(grew))
    return Stall((start - since_ms) / 1000, (start + gap - since_ms) / 1000)


def describe_flow(what: str, run: FaultRun, outcome: Outcome, since_ms: int, until_ms: int) -> str:
    """One line for the test's output: events handled and committed in the window, its longest
    stall of commits."""
    stall = longest_stall(committed_timeline(run), since_ms, until_ms)
    committed = committed_between(run, since_ms, until_ms)
    handled = handled_between(outcome.processed, since_ms, until_ms)
    line = (f"{what} ({(until_ms - since_ms) / 1000:.1f} s): {committed} events committed ({handled} handled); "
            f"commits stalled at most {stall.seconds:.1f} s, from +{stall.began_s:.1f} s to +{stall.ended_s:.1f} s")
    print(line)
    return line
