"""The committer: which slots a commit carries, and what it returns for each (no Kafka: each slot's
transactions are recorded; the slots are SlotState, the committer's fake is at its producer seam)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from confluent_kafka import TopicPartition

from keyrange.worker import committer as committer_module
from keyrange.worker.committer import CommitOutcome, Committer, SlotCommit
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.slot import SlotState
from keyrange.worker.stats import WorkerStats
from keyrange.worker.transactions import OutputRecord, TransactionFailed
from tests.slotstate import held_slot

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0")


class RecordingTransactions:
    """Stands in for a slot's SlotTransactions: records what each commit carried."""

    def __init__(self) -> None:
        self.commits: list[list[OutputRecord]] = []
        self.asked_to_join = asyncio.Event()

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        self.commits.append(records)

    def join(self, records: list[OutputRecord], offsets: list[TopicPartition],
             last: list[OutputRecord] | None = None) -> bool:
        self.asked_to_join.set()
        return False  # its commits end at once: none is ever open to join


def slot_with_a_state_change(n: int) -> tuple[SlotState, RecordingTransactions]:
    transactions = RecordingTransactions()
    return slot(n, transactions), transactions


def test_a_release_commits_only_the_released_slots_and_the_others_commit_on_their_interval() -> None:
    """A release waits for its commit: the slots it keeps must not add their transactions to it."""
    (kept, kept_txn), (released, released_txn) = slot_with_a_state_change(0), slot_with_a_state_change(1)
    committer = Committer(SETTINGS, lambda: [kept, released], WorkerStats())

    outcomes = asyncio.run(committer.commit_now(only={1}))
    assert outcomes == [SlotCommit(released, CommitOutcome.COMMITTED)]
    assert len(released_txn.commits) == 1 and kept_txn.commits == []

    asyncio.run(committer.commit_now())  # the kept slot's change was still staged, not lost
    assert len(kept_txn.commits) == 1 and len(released_txn.commits) == 1  # nothing new on slot 1
    assert [r.key for r in kept_txn.commits[0]] == [b"1000"]


class GatedTransactions(RecordingTransactions):
    """A slot's transactions whose commits wait for `gate`: a producer stuck on Kafka."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.began = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.began.set()
        try:
            await self.gate.wait()
            await super().commit(records, offsets)
        finally:
            self.in_flight -= 1


class CountingTransactions(RecordingTransactions):
    """A slot's transactions that tell each commit as it happens."""

    def __init__(self) -> None:
        super().__init__()
        self.committed = asyncio.Condition()

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        await super().commit(records, offsets)
        async with self.committed:
            self.committed.notify_all()

    async def wait_for_commits(self, n: int) -> None:
        async with self.committed:
            await asyncio.wait_for(self.committed.wait_for(lambda: len(self.commits) >= n), 5.0)


def slot(n: int, transactions: RecordingTransactions) -> SlotState:
    """A held slot `n` with one state change staged (client 1000 + n)."""
    held = held_slot(n, transactions)
    held.change_state(1000 + n, b"1", 0)
    return held


async def stopped(commit_loop: asyncio.Task[None]) -> None:
    """Cancel the committer's loop (and the transactions it started) and wait for it to end."""
    commit_loop.cancel()
    await asyncio.gather(commit_loop, return_exceptions=True)


FAST = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0", commit_interval_ms=5)


def test_a_slot_stuck_in_its_transaction_holds_up_neither_the_other_slots_commits_nor_their_release() -> None:
    async def scenario() -> None:
        stuck_txn, flowing_txn = GatedTransactions(), CountingTransactions()
        stuck, flowing = slot(0, stuck_txn), slot(1, flowing_txn)
        committer = Committer(FAST, lambda: [stuck, flowing], WorkerStats())
        running = asyncio.create_task(committer.run())
        await asyncio.wait_for(stuck_txn.began.wait(), 5.0)
        await flowing_txn.wait_for_commits(1)

        stuck.change_state(2000, b"2", 1)  # staged behind the stuck transaction
        for more in range(2, 5):  # the other slot commits on every interval meanwhile
            flowing.change_state(1000 + more, b"x", more)
            await flowing_txn.wait_for_commits(more)
        assert stuck_txn.most_in_flight == 1 and stuck_txn.commits == []

        flowing.change_state(1999, b"last", 9)
        await asyncio.wait_for(committer.commit_now(only={1}), 5.0)  # a release of the other slot
        await asyncio.wait_for(committer.idle([flowing]), 5.0)
        assert [r.key for r in flowing_txn.commits[-1]] == [b"1999"]

        stuck_txn.gate.set()
        await asyncio.wait_for(committer.commit_now(only={0}), 5.0)  # waits the stuck one out, then the rest
        assert [[r.key for r in c] for c in stuck_txn.commits] == [[b"1000"], [b"2000"]]
        assert stuck_txn.most_in_flight == 1
        await stopped(running)

    asyncio.run(scenario())


async def released_behind_its_transaction(n: int, seconds: float) -> tuple[GatedTransactions, bool]:
    """Slot `n`'s transaction held up for `seconds` while its release waits in `idle`: the slot's
    transactions, and whether that wait ended before the transaction did."""
    txn = GatedTransactions()
    held = slot(n, txn)
    committer = Committer(FAST, lambda: [held], WorkerStats())
    running = asyncio.create_task(committer.run())
    await asyncio.wait_for(txn.began.wait(), 5.0)
    waiting = asyncio.create_task(committer.idle([held]))
    await asyncio.sleep(seconds)
    early = waiting.done()
    txn.gate.set()
    await asyncio.wait_for(waiting, 5.0)
    await stopped(running)
    return txn, early


def test_a_release_waits_out_its_slots_transaction_in_flight() -> None:
    # Ten intervals: idle must still wait, as the transaction has not ended.
    txn, early = asyncio.run(released_behind_its_transaction(0, 0.05))
    assert not early and len(txn.commits) == 1


def test_a_release_waiting_long_for_its_transaction_in_flight_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(committer_module, "SLOW_STEP_SECONDS", 0.02)
    with caplog.at_level(logging.WARNING, logger="keyrange.worker.committer"):
        asyncio.run(released_behind_its_transaction(3, 0.1))
    said = [r.getMessage() for r in caplog.records]
    assert said and all(m.startswith("slots [3]: waiting for their transaction in flight: still waiting after")
                        for m in said), said


class FailingTransactions(RecordingTransactions):
    """A slot's producer fenced by another worker: every commit fails."""

    def __init__(self) -> None:
        super().__init__()
        self.tries = 0

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        self.tries += 1
        raise TransactionFailed("slot 0 was acquired by another worker")


def test_a_failed_interval_transaction_is_returned_by_the_commit_loop_to_act_on() -> None:
    async def scenario() -> None:
        failing = slot(0, FailingTransactions())
        committer = Committer(FAST, lambda: [failing], WorkerStats())
        failed = await asyncio.wait_for(committer.run(), 5.0)
        assert failed.slot is failing and failed.outcome is CommitOutcome.FENCED
        assert failed.error is not None and "acquired by another worker" in str(failed.error)

    asyncio.run(scenario())


def test_a_slot_whose_transaction_failed_never_commits_again_and_the_others_go_on() -> None:
    async def scenario() -> None:
        flowing_txn = CountingTransactions()
        failing_txn = FailingTransactions()
        failing, flowing = slot(0, failing_txn), slot(1, flowing_txn)
        committer = Committer(FAST, lambda: [failing, flowing], WorkerStats())
        failed = await asyncio.wait_for(committer.run(), 5.0)
        assert failed.slot is failing
        running = asyncio.create_task(committer.run())  # goes on: the engine acted on the failure
        await flowing_txn.wait_for_commits(1)
        failing.change_state(1600, b"z", 4)
        flowing.change_state(1500, b"y", 3)
        await flowing_txn.wait_for_commits(2)
        assert not running.done() and failing_txn.tries == 1
        assert await committer.commit_now() == [SlotCommit(failing, CommitOutcome.SLOT_LOST),
                                                SlotCommit(flowing, CommitOutcome.COMMITTED)]
        assert failing_txn.tries == 1
        await stopped(running)

    asyncio.run(scenario())


class GivenUpTransactions(RecordingTransactions):
    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        raise TransactionFailed("slot 2: no commit within 60 s", gave_up=True)


def test_a_release_s_commit_returns_each_slot_s_outcome_fenced_or_given_up() -> None:
    async def scenario() -> None:
        fenced, given_up = slot(0, FailingTransactions()), slot(2, GivenUpTransactions())
        fine = slot(3, RecordingTransactions())
        committer = Committer(FAST, lambda: [fenced, given_up, fine], WorkerStats())
        outcomes = await committer.commit_now()
        assert [(o.slot, o.outcome) for o in outcomes] == [
            (fenced, CommitOutcome.FENCED), (given_up, CommitOutcome.GAVE_UP), (fine, CommitOutcome.COMMITTED)]
        assert outcomes[1].error is not None and outcomes[1].error.gave_up
        assert [o.outcome for o in await committer.commit_now(only={0, 2})] == [CommitOutcome.SLOT_LOST] * 2

    asyncio.run(scenario())


def test_a_commit_waiting_for_a_slots_transaction_leaves_out_the_slot_released_meanwhile() -> None:
    async def scenario() -> None:
        txn = GatedTransactions()
        only = slot(0, txn)
        held = [only]
        committer = Committer(FAST, lambda: list(held), WorkerStats())
        running = asyncio.create_task(committer.run())
        await asyncio.wait_for(txn.began.wait(), 5.0)
        only.change_state(3000, b"3", 2)  # staged behind the transaction in flight
        waiting = asyncio.create_task(committer.commit_now())
        await asyncio.sleep(0)
        held.clear()  # released while commit_now waits: its producer is closed, no transaction may start
        txn.gate.set()
        await asyncio.wait_for(waiting, 5.0)
        assert [[r.key for r in c] for c in txn.commits] == [[b"1000"]]  # nothing committed for it after
        await stopped(running)

    asyncio.run(scenario())


class SlowTransactions(CountingTransactions):
    """A slot's transactions that take `seconds` each, noting when each began (loop time)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.began_at: list[float] = []

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.began_at.append(loop.time())
        await asyncio.sleep(self.seconds)  # a transaction that outlasts the commit interval
        await super().commit(records, offsets)


def test_a_slot_whose_transaction_outlasted_the_interval_starts_its_next_one_as_it_ends() -> None:
    """Not at the next tick: with transactions about as long as the interval (the paced hot counter,
    20 ms), waiting for the tick made every other commit cycle two intervals long."""
    interval = 0.5
    settings = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0",
                              commit_interval_ms=int(interval * 1000))

    async def scenario() -> None:
        txn = SlowTransactions(interval * 1.2)
        held = slot(0, txn)
        committer = Committer(settings, lambda: [held], WorkerStats())
        running = asyncio.create_task(committer.run())
        while not txn.began_at:
            await asyncio.sleep(0.01)
        held.change_state(2000, b"2", 1)  # finished while the first transaction is in flight
        await txn.wait_for_commits(2)
        first, second = txn.began_at[:2]
        assert second - (first + txn.seconds) < interval / 2, (
            f"the next transaction began {second - first - txn.seconds:.3f} s after the first ended")
        await stopped(running)

    asyncio.run(scenario())


def test_the_commit_loop_leaves_a_slot_being_released_to_its_release() -> None:
    # A transaction the loop started while the release drained would make the release wait it out
    # and then commit again: two transactions inside the handoff's pause instead of one.
    async def scenario() -> None:
        releasing_txn, kept_txn = CountingTransactions(), CountingTransactions()
        releasing, kept = slot(0, releasing_txn), slot(1, kept_txn)
        releasing.revoke()
        committer = Committer(FAST, lambda: [releasing, kept], WorkerStats())
        running = asyncio.create_task(committer.run())
        await kept_txn.wait_for_commits(1)
        for more in range(2, 5):  # the loop runs its intervals meanwhile
            kept.change_state(1000 + more, b"x", more)
            await kept_txn.wait_for_commits(more)
        assert releasing_txn.commits == []
        await asyncio.wait_for(committer.commit_now(), 5.0)  # nor does a commit of every held slot
        assert releasing_txn.commits == []
        await asyncio.wait_for(committer.commit_released([releasing]), 5.0)
        assert [[r.key for r in c] for c in releasing_txn.commits] == [[b"1000"]]
        await stopped(running)

    asyncio.run(scenario())


class JoinableTransactions(RecordingTransactions):
    """A slot's transactions whose commit waits for `gate` before it starts to end; until then
    `join` adds to it, as SlotTransactions does; with `fail`, it then fails."""

    def __init__(self, fail: TransactionFailed | None = None) -> None:
        super().__init__()
        self.fail = fail
        self.gate = asyncio.Event()
        self.began = asyncio.Event()
        self._open = False
        self._joined: list[OutputRecord] = []

    async def commit(self, records: list[OutputRecord], offsets: list[TopicPartition],
                     last: list[OutputRecord] | None = None) -> None:
        self._open, self._joined = True, []
        self.began.set()
        await self.gate.wait()
        self._open = False
        if self.fail is not None:
            raise self.fail
        self.commits.append(records + self._joined)

    def join(self, records: list[OutputRecord], offsets: list[TopicPartition],
             last: list[OutputRecord] | None = None) -> bool:
        self.asked_to_join.set()
        if not self._open:
            return False
        self._joined += records
        return True


async def released_during_a_transaction(transactions: GatedTransactions | JoinableTransactions,
                                        ) -> tuple[SlotState, list[SlotCommit], SlotCommit | None]:
    """Slot 0's transaction of client 1000's change in flight (held at its gate); client 2000's
    change finishes and the slot's release commits meanwhile: (the slot, the release's outcomes,
    the failure the commit loop returned when the transaction failed)."""
    held = slot(0, transactions)
    committer = Committer(FAST, lambda: [held], WorkerStats())
    running = asyncio.create_task(committer.run())
    try:
        await asyncio.wait_for(transactions.began.wait(), 5.0)
        held.change_state(2000, b"2", 1)
        held.revoke()
        releasing = asyncio.create_task(committer.commit_released([held]))
        await asyncio.wait_for(transactions.asked_to_join.wait(), 5.0)
        transactions.gate.set()
        outcomes = await asyncio.wait_for(releasing, 5.0)
        failed = isinstance(transactions, JoinableTransactions) and transactions.fail is not None
        return held, outcomes, await asyncio.wait_for(running, 5.0) if failed else None
    finally:
        await stopped(running)


def test_a_release_adds_its_batch_to_the_transaction_in_flight_and_one_commit_ends_both() -> None:
    """On a starved machine the commit loop runs a slot's transactions back to back, so a release
    almost always finds one in flight: waiting for it to end and then committing in a transaction of
    its own was the handoff pause's largest step. What the release commits (the work finished since
    that transaction took its batch) goes into it after its own batch, in order."""
    transactions = JoinableTransactions()
    held, outcomes, _ = asyncio.run(released_during_a_transaction(transactions))
    assert outcomes == [SlotCommit(held, CommitOutcome.COMMITTED, joined=True)]
    assert [[r.key for r in c] for c in transactions.commits] == [[b"1000", b"2000"]]
    assert held.take_batch("events", "g.state") is None  # both batches counted as committed


def test_a_release_that_finds_its_transaction_ending_commits_in_one_of_its_own_after_it() -> None:
    transactions = GatedTransactions()  # its commits are never open to join
    held, outcomes, _ = asyncio.run(released_during_a_transaction(transactions))
    assert outcomes == [SlotCommit(held, CommitOutcome.COMMITTED)]
    assert [[r.key for r in c] for c in transactions.commits] == [[b"1000"], [b"2000"]]  # in order
    assert transactions.most_in_flight == 1


def test_a_release_whose_batch_joined_a_transaction_that_failed_commits_nothing_and_the_loop_returns_the_failure(
) -> None:
    """The release's batch fails with the transaction it joined: the slot is lost, as when the
    release waited that transaction out; its next owner runs those events again."""
    transactions = JoinableTransactions(fail=TransactionFailed("slot 0 was acquired by another worker"))
    held, outcomes, returned = asyncio.run(released_during_a_transaction(transactions))
    assert outcomes == [SlotCommit(held, CommitOutcome.SLOT_LOST)]
    assert returned is not None and returned.slot is held and returned.outcome is CommitOutcome.FENCED
    assert transactions.commits == [] and held.committed_offset == 0
