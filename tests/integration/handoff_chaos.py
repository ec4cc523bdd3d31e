"""Random handoff schedules from a seed, and a harness that plays one against real processes.

A schedule mixes producer bursts, trickles and pauses with split and merge requests at random
moments (some right after another, so they land during a handoff; some during bursts, while the
old owner lags far behind), SIGKILLs of a worker (some while a handoff waits for it) and of the
controller (some mid-handoff), then lets everything settle. The workers are `keyrange worker`
subprocesses in controlled mode (ProcessFleet, as `keyrange run` runs them); the controller is the
real Controller in a subprocess of its own (chaos_controller.py) so it can be killed too.

The schedule is a pure function of the seed; timing on a shared machine is not, so a failing seed
is replayed by running it again (KEYRANGE_CHAOS_SEEDS), not bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keyrange.events import encode_input
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import make_producer
from keyrange.local.fleet import ProcessFleet
from keyrange.ranges.channel import ControlChannel
from keyrange.ranges.layout import SlotLayout, SlotRouter
from tests.checkers import LoggedEvent
from tests.kafkatools import read_topic

PARTITIONS = 12
MAX_WORKERS = 4
CLIENTS = 150
DUPLICATE_RATIO = 0.03
DUPLICATE_MAX_DELAY_S = 4.0
"""Duplicates come 5-400 events after their original, but never later than this (the TTL is 10 s:
every duplicate of these schedules is one the window must drop)."""

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: chaos}}
spec:
  kafka: {{topic: {topic}, groupId: {group}, partitions: {partitions}}}
  {handler}
  concurrency: 8
  maxPending: 200
  dedup: {{ttlSeconds: 10}}
  workers: {{min: 1, max: {max_workers}}}
  scaling: {{lagHighRecords: 400, lagLowRecords: 50, cooldownSeconds: 2}}
"""


HANDLERS = {
    "async": "handler: ledger\n  handlerConfig: {delayMs: 5}",
    "busy-inline": "handler: tests.integration.worker_handlers:busy_inline_ledger",
}
"""The ledger on the queued path (a coroutine sleeping 5 ms: simulated I/O), or on the inline path
with 0.3 ms of CPU per event that holds the worker's loop (worker_handlers.busy_inline_ledger)."""


@dataclass(frozen=True)
class Phase:
    """Produce at `rate` events/s for `seconds` (a pause has rate 0)."""

    kind: str
    seconds: float
    rate: float


@dataclass(frozen=True)
class Action:
    """Something done to the system `at_s` seconds after the load starts."""

    at_s: float
    kind: str
    """up | down | kill-worker | kill-worker-mid-handoff | kill-controller | kill-controller-mid-handoff"""
    restart_after_s: float = 0.0
    """For the controller kills: how long it stays dead."""


@dataclass(frozen=True)
class Schedule:
    """One seed's load and actions."""

    seed: int
    phases: tuple[Phase, ...]
    actions: tuple[Action, ...]
    handler: str = "async"
    """A key of HANDLERS."""

    @classmethod
    def from_seed(cls, seed: int) -> Schedule:
        rng = random.Random(seed)
        phases: list[Phase] = []
        for _ in range(rng.randint(4, 6)):
            kind = rng.choice(["burst", "burst", "trickle", "pause"])
            if kind == "burst":
                phases.append(Phase(kind, round(rng.uniform(2, 5), 1), rng.choice([2000, 3000, 4000])))
            elif kind == "trickle":
                phases.append(Phase(kind, round(rng.uniform(3, 8), 1), rng.choice([20, 50, 150])))
            else:
                phases.append(Phase(kind, round(rng.uniform(1, 4), 1), 0))
        phases.append(Phase("trickle", 4.0, 150))  # the tail a lost handoff would swallow
        load_s = sum(p.seconds for p in phases)
        actions: list[Action] = []
        for _ in range(rng.randint(5, 9)):
            at = round(rng.uniform(0.5, load_s + 3), 1)
            actions.append(Action(at, rng.choice(["up", "up", "down"])))
            if rng.random() < 0.3:  # a second request right behind: it lands during the handoff
                actions.append(Action(round(at + rng.uniform(0.05, 0.6), 2), rng.choice(["up", "down"])))
        actions.append(Action(round(rng.uniform(1, load_s), 1), rng.choice(["kill-worker", "kill-worker-mid-handoff"])))
        if rng.random() < 0.5:
            actions.append(Action(round(rng.uniform(1, load_s), 1), "kill-worker"))
        actions.append(Action(round(rng.uniform(1, load_s), 1),
                              rng.choice(["kill-controller", "kill-controller-mid-handoff"]),
                              round(rng.uniform(0.0, 2.0), 1)))
        # Drawn last, so that the seeds older than this draw keep their load and actions.
        handler = rng.choice(sorted(HANDLERS))
        return cls(seed, tuple(phases), tuple(sorted(actions, key=lambda a: a.at_s)), handler)

    def describe(self) -> str:
        phases = ", ".join(f"{p.kind} {p.seconds:g}s@{p.rate:g}/s" if p.rate else f"pause {p.seconds:g}s"
                           for p in self.phases)
        actions = ", ".join(f"{a.at_s:g}s {a.kind}" + (f" (down {a.restart_after_s:g}s)" if "controller" in a.kind
                                                        else "") for a in self.actions)
        return f"seed {self.seed}: {self.handler} ledger; load [{phases}]; actions [{actions}]"


@dataclass
class Produced:
    """What the load generator sent."""

    records: int = 0
    duplicates: int = 0


def produce(bootstrap: str, topic: str, schedule: Schedule, totals: Produced, stop: threading.Event) -> None:
    """The schedule's phases: ledger commands over CLIENTS clients, DUPLICATE_RATIO of them sent
    again 5-400 events later (at most DUPLICATE_MAX_DELAY_S later), paced in real time."""
    rng = random.Random(schedule.seed * 7919)
    producer = make_producer(bootstrap)
    pending: list[tuple[int, float, bytes, bytes, int]] = []  # (due index, due time, key, value, created)
    index = 0

    def send(key: bytes, value: bytes, created: int) -> None:
        while True:
            try:
                producer.produce(topic, value, key, timestamp=created)
                return
            except BufferError:
                producer.poll(0.05)

    try:
        for phase in schedule.phases:
            start = time.monotonic()
            if phase.rate == 0:
                if stop.wait(phase.seconds):
                    return
                continue
            for i in range(int(phase.seconds * phase.rate)):
                delay = start + i / phase.rate - time.monotonic()
                if delay > 0:
                    producer.poll(0)
                    if stop.wait(delay):
                        return
                client = 1000 + rng.randrange(CLIENTS)
                op = {"op": "drain"} if rng.random() < 0.1 else {"op": "increment", "amount": rng.randint(1, 100)}
                created = int(time.time() * 1000)
                key, value = encode_input(client, str(uuidlib.UUID(int=rng.getrandbits(128), version=4)), created, **op)
                send(key, value, created)
                totals.records += 1
                index += 1
                if rng.random() < DUPLICATE_RATIO:
                    pending.append((index + rng.randint(5, 400), time.monotonic() + DUPLICATE_MAX_DELAY_S,
                                    key, value, created))
                now = time.monotonic()
                for due in [d for d in pending if d[0] <= index or d[1] <= now]:
                    pending.remove(due)
                    send(due[2], due[3], due[4])
                    totals.records += 1
                    totals.duplicates += 1
        for due in pending:
            send(due[2], due[3], due[4])
            totals.records += 1
            totals.duplicates += 1
    finally:
        producer.flush(30)


@dataclass
class ChaosRun:
    """Plays one schedule: the load, the workers, the controller, the actions."""

    bootstrap: str
    topic: str
    workdir: Path
    schedule: Schedule
    partitions: int = PARTITIONS
    max_workers: int = MAX_WORKERS
    """More than `partitions`: the controller cuts each partition into hash-range slots (SlotLayout)."""
    group: str = ""
    fleet: ProcessFleet | None = None
    controller: subprocess.Popen[str] | None = None
    kills: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.group = f"{self.topic}-g"
        self.spec_file = self.workdir / "consumer.yaml"
        self.replicas_file = self.workdir / "replicas"
        self.targets_file = self.workdir / "targets.json"
        self.rng = random.Random(self.schedule.seed * 104729)

    # --- processes -----------------------------------------------------------------------------

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spec_file.write_text(SPEC.format(topic=self.topic, group=self.group, partitions=self.partitions,
                                              max_workers=self.max_workers, handler=HANDLERS[self.schedule.handler]))
        ensure_topics(self.bootstrap, [TopicSpec(self.topic, self.partitions)])
        ControlChannel.ensure_topic(self.bootstrap, self.group)
        self.fleet = ProcessFleet(self.spec_file, self.bootstrap, self.workdir / "logs", ("--log-level", "INFO"),
                                  max_workers=self.max_workers)
        self._start_controller()
        threading.Thread(target=self._reconcile, daemon=True).start()
        self.observer = ControlChannel(self.bootstrap, self.group, "chaos-observer")

    def _start_controller(self) -> None:
        log = open(self.workdir / "controller.log", "ab")  # noqa: SIM115 - the process owns it
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.chaos_controller", str(self.spec_file), self.bootstrap,
             str(self.replicas_file), str(self.targets_file)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        assert self.controller.stdout is not None
        line = self.controller.stdout.readline()
        assert line.strip() == "ready", f"controller did not start: {line!r}, see {self.workdir / 'controller.log'}"
        threading.Thread(target=self._drain_controller_output, args=(self.controller,), daemon=True).start()

    def _drain_controller_output(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.requests.append(line.strip())

    def _reconcile(self) -> None:
        """What the StatefulSet controller does: run the wanted number of workers, restart dead ones."""
        assert self.fleet is not None
        while not self._stop.wait(0.1):
            try:
                wanted = int(self.replicas_file.read_text())
            except (OSError, ValueError):
                continue
            if wanted != self.fleet.desired:
                self.fleet.scale_to(wanted)
            self.fleet.check()
            tmp = self.targets_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.fleet.urls()))
            os.replace(tmp, self.targets_file)

    def stop(self) -> None:
        self._stop.set()
        if self.controller is not None and self.controller.poll() is None:
            assert self.controller.stdin is not None
            self.controller.stdin.close()
            try:
                self.controller.wait(10)
            except subprocess.TimeoutExpired:
                self.controller.kill()
        if self.fleet is not None:
            self.fleet.stop()
        self.observer.close()

    # --- the schedule --------------------------------------------------------------------------

    def play(self) -> Produced:
        """Run the load and the actions; return what was produced once both are done."""
        totals = Produced()
        load = threading.Thread(target=produce, args=(self.bootstrap, self.topic, self.schedule, totals, self._stop))
        began = time.monotonic()
        load.start()
        for action in self.schedule.actions:
            delay = began + action.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._do(action)
        load.join()
        self._ensure_controller()
        return totals

    def _do(self, action: Action) -> None:
        assert self.fleet is not None
        if action.kind in ("up", "down"):
            self._ensure_controller()
            assert self.controller is not None and self.controller.stdin is not None
            self.controller.stdin.write(action.kind + "\n")
            self.controller.stdin.flush()
        elif action.kind.startswith("kill-worker"):
            awaiting = self._handoff_awaiting() if action.kind.endswith("mid-handoff") else frozenset()
            alive = sorted(o for o, w in self.fleet.workers.items() if w.alive())
            victims = sorted(awaiting & set(alive)) or alive
            if victims:
                victim = victims[0] if awaiting else self.rng.choice(victims)
                self.fleet.kill(victim, signal.SIGKILL)
                self.kills.append(f"worker {victim}" + (" (awaited by a handoff)" if awaiting else ""))
        elif action.kind.startswith("kill-controller"):
            in_handoff = bool(self._handoff_awaiting()) if action.kind.endswith("mid-handoff") else False
            if self.controller is not None and self.controller.poll() is None:
                self.controller.kill()
                self.controller.wait()
                self.kills.append("controller" + (" (mid-handoff)" if in_handoff else ""))
            time.sleep(action.restart_after_s)
            self._ensure_controller()

    def _handoff_awaiting(self, wait_s: float = 5.0) -> frozenset[int]:
        """The workers a handoff in transit waits for, waiting up to `wait_s` for one to start."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            self.observer.poll(0.05)
            pub = self.observer.state.publication
            if pub is not None and pub.transit:
                return pub.awaiting
        return frozenset()

    def _ensure_controller(self) -> None:
        if self.controller is None or self.controller.poll() is not None:
            self._start_controller()

    def epoch(self) -> int:
        """The newest published epoch (two per rescale: the move, then the grant)."""
        self.observer.poll(0.1)
        pub = self.observer.state.publication
        return pub.epoch if pub is not None else 0

    def settle(self, timeout_s: float = 120.0) -> None:
        """Wait until no handoff is in flight (the controller finishes whatever the schedule left)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.observer.poll(0.1)
            pub = self.observer.state.publication
            if pub is not None and not pub.transit:
                return
        raise AssertionError(f"a handoff did not complete within {timeout_s:g} s; see {self.workdir}")


def lost_per_slot(log: list[LoggedEvent], processed: list[Mapping[str, Any]], partitions: int,
                  slot_count: int | None) -> dict[str, tuple[int, int, int]]:
    """For a failing seed: per slot (`describe_slot`), how many events have no processed record and
    the lowest and highest offset among them (the clientId as the record key, as the load sends it)."""
    layout = SlotLayout.of_slot_count(partitions, slot_count or partitions)
    router = SlotRouter(layout)
    handled = {r["uuid"] for r in processed}
    lost: dict[int, list[int]] = defaultdict(list)
    for e in log:
        if e.uuid not in handled:
            lost[router.slot_of(e.partition, str(e.client_id).encode())].append(e.offset)
    return {layout.describe_slot(s): (len(o), min(o), max(o)) for s, o in sorted(lost.items())}


def slot_story(workdir: Path, slots: Iterable[str], lines: int = 60, width: int = 300) -> str:
    """For a failing seed: the controller's publications and requests, and the worker log lines that
    name any of `slots` (as `describe_slot` shows them: `'0:2/3': 603`, `0:2/3 from 603`), warn or
    release, in time order: the last `lines` of them, each cut to `width` characters and prefixed
    with its log's name (CI keeps no log files)."""
    marks = [m for s in slots for m in (f"'{s}'", f" {s} from ")]
    found: list[tuple[str, str]] = []
    for log in [workdir / "controller.log", *sorted((workdir / "logs").glob("*.log"))]:
        if not log.exists():
            continue
        worker = log.parent.name == "logs"
        for line in log.read_text(errors="replace").splitlines():
            if (any(m in line for m in marks) or (not worker and ("published" in line or "requested" in line))
                    or (worker and (" WARNING " in line or " ERROR " in line or "released slots" in line))):
                found.append((line[:23], f"{log.stem}: {line[:width]}"))
    found.sort(key=lambda f: f[0])
    return "\n".join(text for _, text in found[-lines:]) or "(no log line names them)"


def processed_read_to(bootstrap: str, topic: str) -> str:
    """For a failing seed: the processed topic as it reads now to its end, {partition: (records, end)}, or
    which partitions an open transaction holds back (`read_topic` without `expect` returns only at the end)."""
    try:
        messages = read_topic(bootstrap, f"{topic}.processed", timeout_seconds=30)
    except AssertionError as exc:
        return str(exc)
    read: dict[int, tuple[int, int]] = {}
    for m in messages:
        count, _ = read.get(m.partition(), (0, 0))
        read[m.partition()] = (count + 1, m.offset() + 1)
    return str(dict(sorted(read.items())))
