"""A slot given back to a worker that held it before: nothing of the earlier holding may linger.

The regression behind the lost tail after a merge: a worker released a slot while it was paused
for backpressure, the slot came back to it later, and librdkafka still had the partition paused
(it keeps the pause flag across `incremental_unassign` / `incremental_assign`). The engine, with a
fresh partition state, believed it was fetching; nothing arrived, and the stale cached high
watermark made the lag read 0, so the planner merged on.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from keyrange.handlers import Handler, load_handler
from keyrange.worker import Worker
from tests.checkers import check_all, first_occurrences
from tests.integration.worker_helpers import produce_stream, run_worker_until, settings_for, wait_for
from tests.kafkatools import read_counts, read_input_log, read_processed


@pytest.fixture
def bootstrap(any_bootstrap: str) -> str:
    """Every test of this module runs on tansu and on Apache Kafka (tests/conftest.py's `broker_engine`)."""
    return any_bootstrap


async def test_a_slot_released_while_paused_fetches_again_when_it_comes_back(bootstrap: str, topic_name: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 600, partitions=1, clients=40, duplicate_ratio=0.0)
    log = read_input_log(bootstrap, topic_name, sent)
    gate = asyncio.Event()

    async def gated(event: dict[str, Any], ctx: Any) -> None:
        await gate.wait()

    settings = settings_for(bootstrap, topic_name, concurrency=4, max_pending=20, fetch_batch_size=10)
    worker = Worker(settings, Handler("gated", gated, True))
    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(lambda: worker.slots[0].paused, what="partition 0 to pause for backpressure")
        release = asyncio.ensure_future(worker.release([0]))
        await wait_for(lambda: worker.slots.get(0) is None or worker.slots[0].revoked,
                       what="the release to revoke the slot")
        gate.set()  # the in-flight calls finish, the release commits them
        await release
        assert worker.held_slots == frozenset()
        await worker.acquire([0])
        await wait_for(lambda: worker.stats.processed >= sent, timeout_seconds=60,
                       what="every event after the slot came back (it stayed paused in librdkafka)")
    finally:
        gate.set()
        await worker.stop()
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", len(first_occurrences(log))),
              read_counts(bootstrap, topic_name, settings.group_id))


async def test_a_failed_attempt_that_mutated_its_state_leaves_no_trace(bootstrap: str, topic_name: str) -> None:
    """The retry, the state in memory and the changelog all see the state before the failed
    attempt; a later owner restoring the changelog continues the very same counts."""
    sent = produce_stream(bootstrap, topic_name, 400, partitions=2, clients=30, duplicate_ratio=0.0)
    log = read_input_log(bootstrap, topic_name, sent)
    handler = "tests.integration.worker_handlers:mutating_counter"
    first = settings_for(bootstrap, topic_name, worker_id="a", retry_backoff_ms=1)
    await run_worker_until(first, handler, [0], lambda w: w.stats.processed >= sum(e.partition == 0 for e in log))
    # Partition 1 first runs on one worker, then moves: its restore reads the changelog.
    second = settings_for(bootstrap, topic_name, worker_id="b", retry_backoff_ms=1)
    in_one = sum(e.partition == 1 for e in log)
    moved = await run_worker_until(second, handler, [1], lambda w: w.stats.processed >= in_one // 2)
    await run_worker_until(first, handler, [1], lambda w: w.stats.processed >= in_one - moved.stats.processed)
    processed = read_processed(bootstrap, f"{topic_name}.processed", sent)
    check_all(log, processed, read_counts(bootstrap, topic_name, first.group_id, covering=sent))
    position = {e.uuid: (e.partition, e.offset) for e in log}
    by_client: dict[int, list[int]] = {}
    for r in sorted(processed, key=lambda r: position[r["uuid"]]):
        by_client.setdefault(r["clientId"], []).append(r["result"]["count"])
    assert all(counts == list(range(1, len(counts) + 1)) for counts in by_client.values()), by_client
    assert {r["result"]["attempt"] for r in processed} == {2}


async def test_a_duplicate_after_the_committed_offset_is_judged_at_its_place_in_the_log(
        any_bootstrap: str, topic_name: str) -> None:
    """The old owner finished events far past its committed offset (a slow client held the offset
    back) and dropped a duplicate in between. The new owner must judge that duplicate by the
    stream time at its place in the log, not by the newest event the old owner finished: replaying
    the finished outputs into the window up front moved the window's clock past the original and
    let the duplicate through."""
    from keyrange.events import encode_input
    from keyrange.kafkaio import TopicSpec, ensure_topics
    from keyrange.loadgen import make_producer
    from tests.integration import worker_handlers

    bootstrap = any_bootstrap
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1)])
    producer = make_producer(bootstrap)
    t0 = int(time.time() * 1000) - 60_000
    records = []
    for i in range(200):  # 10 events of event time per second, 20 s in all
        client = worker_handlers.BLOCK_CLIENT if i == 60 else 1000 + i % 30
        records.append(encode_input(client, f"e{i}", t0 + i * 100))
        if i == 70:  # a duplicate of e50, 2 s of event time after it: well within the 10 s TTL
            records.append(encode_input(1000 + 50 % 30, "e50", t0 + 50 * 100))
    for key, value in records:
        producer.produce(topic_name, value, key, partition=0, timestamp=int(orjson.loads(value)["created"]))
    assert producer.flush(30) == 0
    log = read_input_log(bootstrap, topic_name, len(records))
    worker_handlers.release_blocked.clear()
    first = Worker(settings_for(bootstrap, topic_name, worker_id="a", concurrency=4, max_retries=0),
                   load_handler("tests.integration.worker_handlers:blocks_one_client"))
    await first.start()
    try:
        await first.acquire([0])
        slot = first.slots[0]
        await wait_for(lambda: slot.next_offset == len(records) and slot.committable == 60
                       and slot.finished_ahead == len(records) - 61,
                       what="everything past offset 60 finished while e60's client is held up")
        await first.commit_now()
        releasing = asyncio.ensure_future(first.release([0]))
        await wait_for(lambda: first.slots.get(0) is None or first.slots[0].revoked, what="revoked")
        worker_handlers.release_blocked.set()
        await releasing
    finally:
        worker_handlers.release_blocked.set()
        await first.stop()
    second = await run_worker_until(settings_for(bootstrap, topic_name, worker_id="b"), "noop", [0],
                                    lambda w: w.stats.processed >= 1)
    processed = read_processed(bootstrap, f"{topic_name}.processed", 200)
    check_all(log, processed, read_counts(bootstrap, topic_name, f"{topic_name}-g", covering=len(records)))
    assert second.stats.processed == 1  # e60 only: everything else was finished by the first owner


async def test_a_slot_given_up_whose_restore_fails_once_is_acquired_again(
        bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot whose producer the worker gave up is released and acquired again in place. Right after
    a broker restart that acquire's restore read can make no progress (CI, 2026-11-29: three slots'
    reads of their changelog stalled 30 s, and the worker exited). A running worker tries the slot
    again, as it does when the producer's init fails, instead of exiting. Stand-ins: the commit that
    gives up and the stalled read are injected, as neither can be produced on demand."""
    from keyrange.worker.engine import SlotFailure
    from keyrange.worker.logreader import RestoreError
    from keyrange.worker.restorer import Restorer
    from keyrange.worker.transactions import SlotTransactions, TransactionFailed

    sent = produce_stream(bootstrap, topic_name, 600, partitions=1, clients=40, duplicate_ratio=0.05, ledger=True)
    log = read_input_log(bootstrap, topic_name, sent)
    real_commit, real_restore = SlotTransactions.commit, Restorer.restore_slots
    injected = {"gave up": 0, "restore failed": 0}

    async def commit(self: SlotTransactions, *args: Any, **kwargs: Any) -> None:
        if injected["gave up"] == 0:
            injected["gave up"] += 1
            raise TransactionFailed(f"slot {self.slot}: no commit within 40 s (injected)", gave_up=True)
        await real_commit(self, *args, **kwargs)

    def restore_slots(self: Restorer, *args: Any, **kwargs: Any) -> Any:
        if injected["gave up"] and injected["restore failed"] == 0:
            injected["restore failed"] += 1
            raise RestoreError("reading the changelog to the end made no progress for 30 s (injected)")
        return real_restore(self, *args, **kwargs)

    monkeypatch.setattr(SlotTransactions, "commit", commit)
    monkeypatch.setattr(Restorer, "restore_slots", restore_slots)
    settings = settings_for(bootstrap, topic_name)
    worker = Worker(settings, load_handler("ledger", {}), on_slot_failure=SlotFailure.REACQUIRE_IF_GAVE_UP)
    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(lambda: worker.stats.processed >= len(first_occurrences(log)) and 0 in worker.held_slots,
                       timeout_seconds=60, what="every event, after the slot was acquired again")
    finally:
        await worker.stop()
    assert injected == {"gave up": 1, "restore failed": 1}
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", len(first_occurrences(log))),
              read_counts(bootstrap, topic_name, settings.group_id, covering=len(log)), ledger=True)
