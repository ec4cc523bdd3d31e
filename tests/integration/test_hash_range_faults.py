"""Hash-range slots (several slots of one partition) through a frozen owner and a crash, on Apache
Kafka and on tansu, every guarantee checked with exact counts (check_all via check_everything).

- Fencing across a split: the owner of both hash-range slots of a 1-partition topic is frozen
  (SIGSTOP) with events in flight; a split moves one of its slots to worker 1 while a second process
  replaces it as worker 0 (a pod force-deleted while frozen) and takes the other. Resumed, the
  zombie commits nothing: the acquirers' init_transactions fenced both of its slots' transactional
  ids, and it stands down.
- A crash: a worker holding the two sibling slots of a partition is SIGKILLed mid-stream and
  restarted. Hash-range slots commit no group offset; their position is their totals record. The
  test commits a group offset behind them while the worker is down (as a tool, or a position
  published for users' tools, may): the slots must resume from their totals records all the same.

tansu workaround (as in test_worker_identity.py, see `stopped_while_fenced`): a process is stopped
while it is fenced, so the fence meets it between requests. A process is only ever stopped outside
a transaction end (`stop_outside_transaction_ends`), as its transaction-end lock would otherwise hold
back every other producer of the partition on this host (docs/ranges.md, "Known limits").
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase
from keyrange.ranges.layout import SlotLayout
from tests.conftest import BrokerUnderTest
from tests.integration.supervised import (
    TANSU_SETTLE_SECONDS,
    WORKER_INFO_LOGS,
    SupervisedRun,
    check_everything,
    consumer_yaml,
    stop_outside_transaction_ends,
    stopped_while_fenced,
    supervised,
    wait_for,
)

NO_AUTOSCALING = ("  scaling: {lagHighRecords: 1000000000, lagHighSeconds: 100000, lagLowRecords: 0, "
                  "cooldownSeconds: 0, policy: step}\n")
"""Only the test's forced splits and merges move a slot (the step planner never finds a lag below 0)."""


def handled(run: SupervisedRun) -> int:
    """Events handled so far, as the workers report them (a restarted worker counts from 0)."""
    return run.supervisor.history[-1].processed if run.supervisor.history else 0


def wait_handled(run: SupervisedRun, more: int, what: str) -> None:
    """Wait until the workers handled `more` events beyond what they had handled now."""
    target = handled(run) + more
    wait_for(lambda: handled(run) >= target, 120, f"{more} more events handled {what}", interval=0.1)


def holds(run: SupervisedRun, worker: int, slots: set[int], pid: int | None = None) -> bool:
    """Whether `worker` (in process `pid`, if given) reported holding exactly `slots`."""
    report = run.controller.channel.state.reports.get(worker)
    return report is not None and report.held == slots and (pid is None or report.pid == pid)


def restarted_worker(run: SupervisedRun, ordinal: int, old_pid: int) -> subprocess.Popen[bytes]:
    """Wait until the supervisor runs worker `ordinal` in a process other than `old_pid`; return it."""
    wait_for(lambda: (p := run.fleet.workers[ordinal].process) is not None and p.pid != old_pid, 60,
             f"worker {ordinal} to be restarted", interval=0.1)
    process = run.fleet.workers[ordinal].process
    assert process is not None
    return process


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_frozen_owner_of_a_hash_range_resumed_after_a_split_moved_it_commits_nothing(
        broker_engine: BrokerUnderTest, topic_name: str, tmp_path: Path) -> None:
    bootstrap, on_tansu = broker_engine.bootstrap, broker_engine.engine == "tansu"
    path = tmp_path / "consumer.yaml"
    # A slow handler, so the owner is frozen with events in flight and outputs staged.
    path.write_text(consumer_yaml("zombie", topic_name, 1, "{delayMs: 20}", (1, 2), NO_AUTOSCALING))
    shape = LoadShape(rate=150, clients=80, duplicate_ratio=0.05, ledger=True, seed=17)
    replacement_log = tmp_path / "replacement.log"
    replacement = None
    # Worker logs at INFO (each restore's line) and, on a failed check, the topics kept: a rare
    # failure on tansu must say which restore lost what.
    with supervised(path, bootstrap, tmp_path / "run", shape, [Phase(40, 150)], worker_args=WORKER_INFO_LOGS) as run:
        try:
            assert run.controller.layout == SlotLayout(1, 2)
            wait_for(lambda: holds(run, 0, {0, 1}), 60, "worker 0 to hold both hash ranges of partition 0")
            run.load.start()
            wait_handled(run, 300, "by worker 0")
            zombie = run.fleet.workers[0].process
            assert zombie is not None
            stop_outside_transaction_ends(zombie.pid, run.transaction_end_locks)
            if on_tansu:  # tansu workaround: its last requests are answered before anyone fences it
                time.sleep(TANSU_SETTLE_SECONDS)
            state = run.controller.channel.state
            split = run.controller.request_scale("up", "test: split while worker 0 is frozen")
            assert split.applied, split.detail
            wait_for(lambda: state.publication is not None and state.publication.transit == {1}, 60,
                     "the split's epoch: slot 0:1/2 in transit from the frozen worker 0 to worker 1")
            # The frozen pod is force-deleted and replaced: the replacement claims worker 0, applies the
            # epoch (acquires slot 0, fencing the zombie's producer of it), the grant follows and worker 1
            # acquires slot 1 (fencing the zombie's other producer).
            with replacement_log.open("wb") as out:
                replacement = subprocess.Popen(
                    [sys.executable, "-m", "keyrange.cli", "worker", "--spec-file", str(path), "--bootstrap",
                     bootstrap, "--worker-id", "0", *WORKER_INFO_LOGS], stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL)
            wait_for(lambda: holds(run, 0, {0}, replacement.pid) and holds(run, 1, {1})
                     and state.publication is not None and not state.publication.transit, 120,
                     f"the replacement to hold slot 0 and worker 1 slot 1: {run.controller.status().last_decision}",
                     interval=0.1)
            wait_handled(run, 300, "after the split, with the zombie frozen")
            zombie.send_signal(signal.SIGCONT)
            zombie_code = zombie.wait(60)
            zombie_output = run.fleet.worker_log(0).read_text(errors="replace")
            # The supervisor restarts worker 0 (the newest claim): the replacement stands down.
            with stopped_while_fenced(replacement.pid, on_tansu, run.transaction_end_locks):
                restarted = restarted_worker(run, 0, zombie.pid)
                if on_tansu:
                    wait_for(lambda: holds(run, 0, {0}, restarted.pid), 60, "the restarted worker 0 to hold slot 0")
            replacement_code = replacement.wait(60)
            # Every fault is done: the load ends once the restarted worker 0 holds its slot and more
            # of the load was handled (unless a slow machine took all of its 40 s for the faults).
            wait_for(lambda: holds(run, 0, {0}, restarted.pid), 60, "the restarted worker 0 to hold slot 0")
            target = handled(run) + 300
            wait_for(lambda: handled(run) >= target or not run.load.is_alive(), 120,
                     "300 more events handled after the replacement stood down", interval=0.1)
            run.end_load()
            check_everything(bootstrap, topic_name, f"{topic_name}-g", run.totals.sent, keep_in=tmp_path / "topics")
        finally:
            if replacement is not None and replacement.poll() is None:
                replacement.kill()
    assert zombie_code != 0, zombie_output[-3000:]
    assert "claimed by another process" in zombie_output or "fenced this one" in zombie_output, zombie_output[-3000:]
    assert replacement_code == 2, replacement_log.read_text(errors="replace")[-3000:]
    print(f"zombie exited {zombie_code}; its transaction fenced by the broker: {'fenced this one' in zombie_output}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_holding_two_sibling_hash_ranges_resumes_them_from_their_totals_after_a_crash(
        broker_engine: BrokerUnderTest, topic_name: str, tmp_path: Path) -> None:
    bootstrap = broker_engine.bootstrap
    path = tmp_path / "consumer.yaml"
    # 2 partitions and workers.max 4: 2 hash ranges per partition; 2 workers hold a partition each.
    path.write_text(consumer_yaml("crash", topic_name, 2, "{delayMs: 2}", (2, 4), NO_AUTOSCALING))
    shape = LoadShape(rate=300, clients=120, duplicate_ratio=0.05, ledger=True, seed=23)
    group = f"{topic_name}-g"
    with supervised(path, bootstrap, tmp_path / "run", shape, [Phase(30, 300)], spare_workers=0) as run:
        assert run.controller.layout == SlotLayout(2, 2)
        wait_for(lambda: holds(run, 0, {0, 1}) and holds(run, 1, {2, 3}), 60,
                 "worker 0 to hold both hash ranges of partition 0, worker 1 those of partition 1")
        run.load.start()
        wait_handled(run, 1500, "before the crash")
        victim = run.fleet.workers[0].process
        assert victim is not None
        run.fleet.kill(0, signal.SIGKILL)
        victim.wait(30)
        commit_group_offset(bootstrap, topic_name, group, 0, behind=500)
        restarted = restarted_worker(run, 0, victim.pid)
        wait_for(lambda: holds(run, 0, {0, 1}, restarted.pid), 120, "the restarted worker 0 to hold slots 0 and 1")
        wait_handled(run, 500, "after the restart")
        run.end_load()
        check_everything(bootstrap, topic_name, group, run.totals.sent)


def commit_group_offset(bootstrap: str, topic: str, group: str, partition: int, behind: int) -> None:
    """Commit the group's offset of `partition` at `behind` records before its end (never below 0)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "log_level": 3})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        consumer.commit(offsets=[TopicPartition(topic, partition, max(0, high - behind))], asynchronous=False)
    finally:
        consumer.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_merge_while_the_old_owner_lags_behind_hands_its_hash_range_over_whole(
        broker_engine: BrokerUnderTest, topic_name: str, tmp_path: Path) -> None:
    """The new owner already fetches the partition for its sibling slot, far ahead of where the
    moved slot resumes: it seeks the partition back while records of its earlier fetch position
    are still on their way to it."""
    bootstrap = broker_engine.bootstrap
    path = tmp_path / "consumer.yaml"
    # About 200 ev/s a worker: both slots lag behind a load of 500 ev/s.
    path.write_text(consumer_yaml("merge", topic_name, 1, "{delayMs: 10}", (1, 2),
                                  NO_AUTOSCALING + "  concurrency: 2\n"))
    shape = LoadShape(rate=500, clients=200, duplicate_ratio=0.05, ledger=True, seed=29)
    with supervised(path, bootstrap, tmp_path / "run", shape, [Phase(15, 500)]) as run:
        state = run.controller.channel.state
        wait_for(lambda: holds(run, 0, {0, 1}), 60, "worker 0 to hold both hash ranges of partition 0")
        split = run.controller.request_scale("up", "test: one hash range per worker")
        assert split.applied, split.detail
        wait_for(lambda: holds(run, 0, {0}) and holds(run, 1, {1}) and state.publication is not None
                 and not state.publication.transit, 60, "one hash range per worker")
        run.load.start()
        wait_handled(run, 1500, "by both workers")
        merge = run.controller.request_scale("down", "test: merge while both lag behind")
        assert merge.applied, merge.detail
        wait_for(lambda: holds(run, 0, {0, 1}) and state.publication is not None and not state.publication.transit,
                 60, "worker 0 to hold both hash ranges again")
        # The merge is done: the load ends here (more would only lengthen the one worker's backlog),
        # and what it sent, the moved hash range's backlog included, is what the checks read.
        run.end_load()
        check_everything(bootstrap, topic_name, f"{topic_name}-g", run.totals.sent)
