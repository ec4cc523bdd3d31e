"""A StreamConsumer run by `keyrange run`'s supervisor inside a test, with load and a ticker, and
everything it produced read back and checked: shared by the tests that drive worker processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from keyrange.kafkaquirks import transaction_end_lock, transactions_end_one_at_a_time
from keyrange.loadgen import LoadShape
from keyrange.local.fleet import ProcessFleet
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.supervisor import Supervisor
from keyrange.ranges.controller import Controller, ControllerStatus
from keyrange.spec import load_file
from tests.checkers import check_all
from tests.kafkatools import dump_topics, read_counts, read_input_log, read_processed


def wait_for(condition: Callable[[], bool], timeout_seconds: float, what: str | Callable[[], str],
             interval: float = 0.01) -> None:
    """Poll `condition` every `interval` until it holds; AssertionError naming `what` after `timeout_seconds`
    (a callable `what` is asked then, so that it can say what the state was at the timeout)."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {said}")
        time.sleep(interval)


def describe_status(status: ControllerStatus) -> str:
    """The controller's state for a failure message: its map, handoff and last decision."""
    m = status.map
    ranges = " ".join(f"w{a.worker}={m.describe_range(a.range, status.layout)}" for a in m.assignments)
    lags = ", ".join(f"{x.records} ({x.seconds:.1f} s)" for x in status.range_lag)
    return (f"epoch {status.epoch} [{ranges}], handoff {status.phase.name.lower()} "
            f"(awaiting {sorted(status.handoff_awaiting)}, starting {status.starting}), lag per range {lags}; "
            f"last decision: {status.last_decision}")


WORKER_INFO_LOGS = ("--log-level", "INFO")
"""`keyrange worker` arguments for a run whose worker logs must say what each restore and handoff did."""

TANSU_SETTLE_SECONDS = 1.0
"""How long a stopped process's last requests get to be answered by tansu before a fence."""


def stop_outside_transaction_ends(pid: int, end_locks: Iterable[Path], timeout_seconds: float = 30) -> None:
    """SIGSTOP `pid` while it ends no transaction: while this process holds `end_locks` (those its
    slot producers end transactions under), until every thread of `pid` has stopped.

    A worker stopped inside a transaction end would keep its partition's host-wide lock
    (kafkaquirks.transactions_end_one_at_a_time): every other producer of that partition here would
    wait the Kafka timeout (30 s) before each of its transaction ends (docs/ranges.md, "Known limits")."""
    with ExitStack() as held:
        for lock in sorted(set(end_locks)):
            if not held.enter_context(transactions_end_one_at_a_time(lock, timeout_seconds)):
                raise AssertionError(f"{lock} was held for {timeout_seconds:g} s: a transaction end never returned")
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: all_threads_stopped(pid), timeout_seconds, f"process {pid} to stop")


def transaction_end_locks(bootstrap: str, sink: str, partitions: int) -> list[Path]:
    """The host-wide locks the slot producers writing `sink` (of `partitions` partitions, as the
    input's) end their transactions under (kafkaquirks.transaction_end_lock): one per partition,
    and the one of a sink laid out unlike the input."""
    return [transaction_end_lock(bootstrap, sink, partition) for partition in (None, *range(partitions))]


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped by a signal (state T in /proc)."""
    states = [(task / "stat").read_text().rpartition(")")[2].split()[0]
              for task in Path(f"/proc/{pid}/task").iterdir()]
    return bool(states) and all(state == "T" for state in states)


@contextmanager
def stopped_while_fenced(pid: int, on_tansu: bool, end_locks: Iterable[Path]) -> Iterator[None]:
    """On tansu, SIGSTOP `pid` for the block (outside a transaction end: `stop_outside_transaction_ends`,
    with `end_locks` = `SupervisedRun.transaction_end_locks`; its requests answered first); elsewhere nothing.

    tansu workaround: tansu (0.6) can leave a transaction open for good when its transactional id
    is initialised while the producer's requests of that transaction are still being handled
    (docs/ranges.md, "Known limits"), so a process about to be fenced there is stopped first and
    the fence meets it between requests, as it meets a zombie."""
    if on_tansu:
        stop_outside_transaction_ends(pid, end_locks)
        time.sleep(TANSU_SETTLE_SECONDS)
    try:
        yield
    finally:
        if on_tansu:
            os.kill(pid, signal.SIGCONT)


def consumer_yaml(name: str, topic: str, partitions: int, handler_config: str = "{delayMs: 1}",
                  workers: tuple[int, int] = (1, 1), extra: str = "") -> str:
    """A ledger StreamConsumer of `topic` (group `<topic>-g`), with a TTL long enough for handoffs."""
    return (f"apiVersion: keyrange.dev/v1alpha1\nkind: StreamConsumer\nmetadata: {{name: {name}}}\nspec:\n"
            f"  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: {partitions}}}\n"
            f"  handler: ledger\n  handlerConfig: {handler_config}\n  dedup: {{ttlSeconds: 120}}\n"
            f"  workers: {{min: {workers[0]}, max: {workers[1]}}}\n{extra}")


@dataclass
class SupervisedRun:
    """A started supervisor, its controller and fleet, and the load it is fed (`start_load`)."""

    supervisor: Supervisor
    load: threading.Thread
    stop: threading.Event
    totals: LoadTotals = field(default_factory=LoadTotals)
    load_stop: threading.Event = field(default_factory=threading.Event)
    """Ends the load before its phases ran out (`end_load`); set when the run ends in any case."""

    @property
    def controller(self) -> Controller:
        assert self.supervisor.controller is not None
        return self.supervisor.controller

    @property
    def fleet(self) -> ProcessFleet:
        assert self.supervisor.fleet is not None
        return self.supervisor.fleet

    def worker_holds_slots(self, worker: int = 0) -> Callable[[], bool]:
        """A condition: `worker` reported holding slots."""
        reports = self.controller.channel.state.reports
        return lambda: worker in reports and bool(reports[worker].held)

    @property
    def transaction_end_locks(self) -> list[Path]:
        """The host-wide locks the consumer's slot producers end their transactions under
        (`transaction_end_locks`)."""
        sink, bootstrap = self.supervisor.consumer.spec.sink_topic, self.supervisor.bootstrap
        assert bootstrap is not None
        return transaction_end_locks(bootstrap, sink, self.controller.layout.partitions)

    def finish_load(self, timeout_seconds: float = 120) -> None:
        """Wait until the load was all sent."""
        self.load.join(timeout=timeout_seconds)
        assert not self.load.is_alive(), "the load did not finish"

    def end_load(self) -> None:
        """End the load now, once every step of a test is done: what it sent so far is what the
        checks read (`totals`)."""
        self.load_stop.set()
        self.finish_load()


@contextmanager
def ticking(supervisor: Supervisor, stop: threading.Event) -> Iterator[Controller]:
    """Start `supervisor` and tick it every 0.5 s until `stop` is set (on exit at the latest); stop it."""
    supervisor.start()
    assert supervisor.controller is not None

    def tick() -> None:
        while not stop.wait(0.5):
            supervisor.tick()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield supervisor.controller
    finally:
        stop.set()
        ticker.join(timeout=10)
        supervisor.stop()


@contextmanager
def supervised(spec_path: Path, bootstrap: str, run_dir: Path, shape: LoadShape, phases: list[Phase],
               spare_workers: int = 1, worker_args: tuple[str, ...] = ()) -> Iterator[SupervisedRun]:
    """Start the supervisor of `spec_path` ticking every 0.5 s; `run.load.start()` sends `phases`.
    `worker_args`: more `keyrange worker` arguments (e.g. `WORKER_INFO_LOGS`)."""
    supervisor = Supervisor(load_file(spec_path), spec_path, bootstrap, run_dir, tick_seconds=0.5,
                            spare_workers=spare_workers, worker_args=worker_args)
    stop, load_stop, totals = threading.Event(), threading.Event(), LoadTotals()
    load = threading.Thread(target=produce_phases, args=(bootstrap, supervisor.consumer.spec.kafka.topic, shape,
                                                         phases, load_stop, totals), daemon=True)
    with ticking(supervisor, stop):
        try:
            yield SupervisedRun(supervisor, load, stop, totals, load_stop)
        finally:
            load_stop.set()


def check_everything(bootstrap: str, topic: str, group: str, sent: int, keep_in: Path | None = None) -> int:
    """Read the input, the processed records and the committed totals; check_all with the ledger
    oracle, and that every distinct event was processed; return how many that is. With `keep_in`,
    a failed check first writes every topic of the consumer there (`dump_topics`): the session's
    broker, and its data, are gone when the failure is looked at."""
    try:
        log = read_input_log(bootstrap, topic, sent)
        distinct = len({e.uuid for e in log})
        processed = read_processed(bootstrap, f"{topic}.processed", distinct, timeout_seconds=120)
        counts = read_counts(bootstrap, topic, group, covering=len(log))
        check_all(log, list(processed), counts, ledger=True)
        assert len(processed) == distinct
    except AssertionError:
        if keep_in is not None:
            dump_topics(bootstrap, [topic, f"{topic}.processed", f"{topic}.dlq", f"{group}.state",
                                    f"{group}.control"], keep_in)
        raise
    return distinct
