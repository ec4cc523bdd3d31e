"""The worker against a real broker (tansu and Apache Kafka): thousands of events, >100 clients, duplicates.

Every test runs the guarantee checkers (tests/checkers.py) on what reached the sink.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import Counter
from typing import Any
from unittest.mock import patch

import orjson
import pytest
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from keyrange.events import DLQ_ATTEMPTS, DLQ_OFFSET, DLQ_PARTITION, DLQ_REASON, encode_input
from keyrange.handlers import Handler, load_handler
from keyrange.loadgen import make_producer
from keyrange.worker import Worker
from keyrange.worker.restorer import Restorer
from tests.checkers import check_all, check_order_per_client, first_occurrences
from tests.integration.worker_handlers import FAIL_FIRST_MARK, FAIL_MARK
from tests.integration.worker_helpers import produce_stream, run_worker_until, settings_for, wait_for
from tests.kafkatools import read_counts, read_input_log, read_processed, read_topic

PARTITIONS = 6


@pytest.fixture
def bootstrap(any_bootstrap: str) -> str:
    """Every test of this module runs on tansu and on Apache Kafka (tests/conftest.py's `broker_engine`)."""
    return any_bootstrap


@pytest.mark.parametrize("ledger_config", [{"delayMs": 1}, {}], ids=["async", "inline"])
async def test_many_clients_with_duplicates_keep_every_guarantee(bootstrap: str, topic_name: str,
                                                                 ledger_config: dict[str, int]) -> None:
    sent = produce_stream(bootstrap, topic_name, 4000, PARTITIONS, clients=150, duplicate_ratio=0.05, ledger=True)
    log = read_input_log(bootstrap, topic_name, sent)
    distinct = len(first_occurrences(log))
    settings = settings_for(bootstrap, topic_name, concurrency=32, handler_config=ledger_config)
    worker = await run_worker_until(settings, "ledger", list(range(PARTITIONS)),
                                    lambda w: w.stats.processed >= distinct)
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct)
    check_all(log, processed, read_counts(bootstrap, topic_name, settings.group_id), ledger=True)
    assert worker.stats.duplicates == sent - distinct
    assert worker.stats.consumed == sent


async def test_slow_client_does_not_hold_the_others_back(bootstrap: str, topic_name: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 3000, PARTITIONS, clients=120, duplicate_ratio=0.0)
    log = read_input_log(bootstrap, topic_name, sent)
    slow_client = log[0].client_id
    slow_total = sum(1 for e in log if e.client_id == slow_client)
    others_total = sent - slow_total
    done_by_client: Counter[int] = Counter()
    release_slow = asyncio.Event()

    async def handler(event: dict[str, Any], ctx: Any) -> None:
        if event["clientId"] == slow_client:
            await release_slow.wait()  # stuck until every other client is done
        await asyncio.sleep(0.001)
        done_by_client[event["clientId"]] += 1

    settings = settings_for(bootstrap, topic_name, concurrency=16)
    worker = Worker(settings, Handler("slow-one", handler, True))
    await worker.start()
    try:
        await worker.acquire(range(PARTITIONS))
        others_done = lambda: sum(n for c, n in done_by_client.items() if c != slow_client) >= others_total  # noqa: E731
        await wait_for(others_done, what="every other client to finish while one client is stuck")
        assert done_by_client[slow_client] == 0
        release_slow.set()
        await wait_for(lambda: worker.stats.processed >= sent, what="the slow client to finish")
    finally:
        release_slow.set()
        await worker.stop()
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", sent),
              read_counts(bootstrap, topic_name, settings.group_id))


@pytest.mark.parametrize("handler", ["async_counter", "inline_counter"])
async def test_bad_input_and_failing_events_reach_the_dlq_and_later_events_flow(
        bootstrap: str, topic_name: str, handler: str) -> None:
    produce_stream(bootstrap, topic_name, 1500, PARTITIONS, clients=100, duplicate_ratio=0.02)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "message.max.bytes": 2_000_000})
    now = int(time.time() * 1000)
    bad_values = [b"not json", b"[1, 2]", b'{"clientId": 1001}', b'{"clientId": "x", "uuid": "u"}',
                  b"x" * 1_000_001]
    for value in bad_values:
        producer.produce(topic_name, value, b"1001", timestamp=now)
    failing = []
    for i in range(5):
        key, value = encode_input(1002, f"failing-{i}", now, mode=FAIL_MARK)
        producer.produce(topic_name, value, key, timestamp=now)
        failing.append(f"failing-{i}")
    # The failing client's later events must still be handled.
    followers = []
    for i in range(5):
        key, value = encode_input(1002, f"after-{i}", now)
        producer.produce(topic_name, value, key, timestamp=now)
        followers.append(f"after-{i}")
    assert producer.flush(30) == 0
    raw = read_topic(bootstrap, topic_name)
    log = read_input_log_lenient(raw)
    distinct = len(first_occurrences(log))
    settings = settings_for(bootstrap, topic_name, concurrency=16, max_retries=2, retry_backoff_ms=5)
    worker = await run_worker_until(settings, f"tests.integration.worker_handlers:{handler}",
                                    list(range(PARTITIONS)),
                                    lambda w: w.stats.processed + w.stats.dead_letters >= distinct + len(bad_values))
    dead = read_topic(bootstrap, f"{topic_name}.dlq", expect=len(bad_values) + len(failing))
    reasons = Counter(dict(m.headers())[DLQ_REASON].decode() for m in dead)
    assert reasons == {"not-json": 1, "not-an-object": 1, "missing-field": 1, "bad-field": 1, "oversized": 1,
                       "handler-error": len(failing)}
    for m in dead:
        headers = dict(m.headers())
        source = [r for r in raw if r.partition() == int(headers[DLQ_PARTITION])
                  and r.offset() == int(headers[DLQ_OFFSET])]
        assert source and source[0].value() == m.value() and source[0].key() == m.key()
        if headers[DLQ_REASON] == b"handler-error":
            assert headers[DLQ_ATTEMPTS] == b"3"
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct - len(failing))
    assert {r["uuid"] for r in processed} >= set(followers)
    counts = read_counts(bootstrap, topic_name, settings.group_id)
    assert counts.dead_lettered == len(bad_values) + len(failing)
    # The bad records are not events of the log: take them out of the accounting.
    check_all(log, processed, dataclasses.replace(counts, dead_lettered=len(failing)), dead_lettered=failing)
    assert worker.stats.dead_letters == len(bad_values) + len(failing)


def read_input_log_lenient(raw: list[Any]) -> list[Any]:
    """The parseable input records as LoggedEvents (bad ones are checked through the DLQ)."""
    from tests.checkers import LoggedEvent

    out = []
    for m in raw:
        try:
            body = orjson.loads(m.value())
            out.append(LoggedEvent(m.partition(), m.offset(), body["clientId"], body["uuid"], body))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return [e for e in out if isinstance(e.client_id, int)]


async def test_partitions_pause_past_max_pending_and_resume(bootstrap: str, topic_name: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 2500, 2, clients=100, duplicate_ratio=0.0)
    log = read_input_log(bootstrap, topic_name, sent)
    settings = settings_for(bootstrap, topic_name, concurrency=8, max_pending=60, fetch_batch_size=50,
                            handler_config={"meanMs": 2, "stddevMs": 0})
    worker = Worker(settings, load_handler("sleep", settings.handler_config))
    max_seen = 0
    await worker.start()
    try:
        await worker.acquire([0, 1])

        paused_gauge_seen = False
        max_lag = 0.0

        def gauge(name: str, partition: str) -> float:
            labels = {"consumer": settings.group_id, "worker": "w0", "partition": partition}
            return REGISTRY.get_sample_value(name, labels) or 0.0

        def sample() -> bool:
            nonlocal max_seen, paused_gauge_seen, max_lag
            max_seen = max([max_seen] + [slot.pending for slot in worker.slots.values()])
            paused_gauge_seen = paused_gauge_seen or any(gauge("keyrange_partition_paused", p) == 1 for p in "01")
            max_lag = max(max_lag, sum(gauge("keyrange_consumer_lag", p) for p in "01"))
            return worker.stats.processed >= sent

        await wait_for(sample, what="all events with backpressure")
    finally:
        await worker.stop()
    assert worker.stats.pauses > 0 and paused_gauge_seen
    # The backlog shows as lag (records behind the high watermark) while paused partitions wait.
    assert max_lag > 200
    # Bounded: a partition is checked after every fetch and paused before the next one, and a
    # pause drops what the consumer had buffered for it, so it overshoots by one fetch at most.
    assert max_seen <= settings.max_pending + settings.fetch_batch_size
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", sent),
              read_counts(bootstrap, topic_name, settings.group_id))


@pytest.mark.parametrize("handler", ["sync_counter", "async_counter", "inline_counter"])
async def test_sync_and_async_user_handlers(bootstrap: str, topic_name: str, handler: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 2000, PARTITIONS, clients=110, duplicate_ratio=0.03)
    log = read_input_log(bootstrap, topic_name, sent)
    distinct = len(first_occurrences(log))
    settings = settings_for(bootstrap, topic_name, concurrency=24)
    await run_worker_until(settings, f"tests.integration.worker_handlers:{handler}", list(range(PARTITIONS)),
                           lambda w: w.stats.processed >= distinct)
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct)
    check_all(log, processed, read_counts(bootstrap, topic_name, settings.group_id))
    check_counts_follow_the_log(log, processed)
    if handler == "sync_counter":
        assert {r["result"]["thread"] for r in processed} == {"keyrange-handler"}
    if handler == "inline_counter":
        assert {r["result"]["thread"] for r in processed} == {"MainThread"}


def check_counts_follow_the_log(log: list[Any], processed: list[dict[str, Any]]) -> None:
    """Keyed state counted each client's events in log order: 1, 2, 3, ..."""
    position = {e.uuid: (e.partition, e.offset) for e in first_occurrences(log)}
    by_client: dict[int, list[Any]] = {}
    for r in sorted(processed, key=lambda r: position[r["uuid"]]):
        by_client.setdefault(r["clientId"], []).append(r["result"]["count"])
    assert all(counts == list(range(1, len(counts) + 1)) for counts in by_client.values())


async def test_an_inline_handler_s_failed_first_attempt_is_retried_behind_nothing(bootstrap: str,
                                                                                   topic_name: str) -> None:
    """A failed inline attempt queues its event for the retries; the client's later events, which
    would otherwise run inline at once, wait behind it (order), and other clients keep flowing."""
    sent = produce_stream(bootstrap, topic_name, 1200, PARTITIONS, clients=60, duplicate_ratio=0.02)
    producer = make_producer(bootstrap)
    now = int(time.time() * 1000)
    marked = set()
    for client in (2001, 2002, 2003):
        for i in range(30):
            mode = FAIL_FIRST_MARK if i % 3 == 0 else None
            key, value = encode_input(client, f"c{client}-{i}", now, **({"mode": mode} if mode else {}))
            producer.produce(topic_name, value, key, timestamp=now)
            if mode:
                marked.add(f"c{client}-{i}")
    assert producer.flush(30) == 0
    log = read_input_log(bootstrap, topic_name, sent + 90)
    distinct = len(first_occurrences(log))
    settings = settings_for(bootstrap, topic_name, concurrency=16, max_retries=2, retry_backoff_ms=20)
    await run_worker_until(settings, "tests.integration.worker_handlers:inline_counter", list(range(PARTITIONS)),
                           lambda w: w.stats.processed >= distinct)
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct)
    check_all(log, processed, read_counts(bootstrap, topic_name, settings.group_id))
    check_counts_follow_the_log(log, processed)
    attempts = {r["uuid"]: r["result"]["attempt"] for r in processed}
    assert {attempts[u] for u in marked} == {2}
    assert {a for u, a in attempts.items() if u not in marked} == {1}


@pytest.mark.parametrize("commit", [True, False], ids=["graceful", "fenced"])
async def test_release_then_acquire_elsewhere_hands_over_state_and_dedup(bootstrap: str, topic_name: str,
                                                                        commit: bool) -> None:
    sent = produce_stream(bootstrap, topic_name, 4000, PARTITIONS, clients=130, duplicate_ratio=0.05, ledger=True)
    log = read_input_log(bootstrap, topic_name, sent)
    distinct = len(first_occurrences(log))
    first = Worker(settings_for(bootstrap, topic_name, worker_id="a", concurrency=8,
                                handler_config={"delayMs": 2}), load_handler("ledger", {"delayMs": 2}))
    second = Worker(settings_for(bootstrap, topic_name, worker_id="b", concurrency=8,
                                 handler_config={"delayMs": 2}), load_handler("ledger", {"delayMs": 2}))
    await first.start()
    await second.start()
    try:
        await first.acquire(range(PARTITIONS))
        await wait_for(lambda: first.stats.processed >= distinct // 4, what="a quarter of the events")
        moving = [0, 2, 4]
        # Fenced: the slots are dropped without committing; their uncommitted outputs go with
        # their offsets, so the new owner runs those events exactly once.
        await first.release(moving, commit=commit)
        assert first.held_slots == frozenset({1, 3, 5})
        await second.acquire(moving)
        assert second.held_slots == frozenset(moving)
        await wait_for(lambda: first.stats.processed + second.stats.processed >= distinct,
                       what="both workers to finish")
    finally:
        await first.stop()
        await second.stop()
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct)
    check_all(log, processed, read_counts(bootstrap, topic_name, first.settings.group_id), ledger=True)
    # Each worker counted only the drops whose offsets it committed: together, each drop once.
    assert first.stats.duplicates + second.stats.duplicates == sent - distinct


async def test_release_during_acquire_never_handles_the_slot(bootstrap: str, topic_name: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 500, PARTITIONS, clients=100, duplicate_ratio=0.0)
    log = read_input_log(bootstrap, topic_name, sent)
    worker = Worker(settings_for(bootstrap, topic_name), load_handler("noop"))
    await worker.start()
    # The release must come while the acquire restores: hold the restore until it has.
    restoring, released = threading.Event(), threading.Event()
    restore_slots = Restorer.restore_slots

    def restore_after_the_release(*args: Any, **kwargs: Any) -> Any:
        restoring.set()
        assert released.wait(60), "the release never came"
        return restore_slots(*args, **kwargs)

    with patch.object(Restorer, "restore_slots", restore_after_the_release):
        try:
            acquiring = asyncio.ensure_future(worker.acquire([0, 1]))
            assert await asyncio.to_thread(restoring.wait, 60), "the acquire never began restoring"
            await worker.release([1])
            released.set()
            await acquiring
            assert worker.held_slots == frozenset({0})
            in_zero = sum(1 for e in log if e.partition == 0)
            await wait_for(lambda: worker.stats.processed >= in_zero, what="partition 0")
            # Stray handling of partition 1 would show before this marker is handled: partition 1's
            # records were all written before the acquire, so had it been assigned, the first fetches
            # (which cover every assigned partition) would have brought them, and the marker, written
            # to partition 0 only now, comes in a later one.
            producer = make_producer(bootstrap)
            key, value = encode_input(0, "marker", int(time.time() * 1000))
            producer.produce(topic_name, value, key, partition=0)
            assert producer.flush(30) == 0
            await wait_for(lambda: worker.stats.processed >= in_zero + 1, what="the marker")
            assert worker.stats.processed == in_zero + 1
        finally:
            released.set()
            await worker.stop()
    processed = read_processed(bootstrap, f"{topic_name}.processed", in_zero + 1)
    assert {r["partition"] for r in processed} == {0}
    processed = [r for r in processed if r["uuid"] != "marker"]
    check_order_per_client(log, processed)


async def test_dedup_after_handoff_and_lag_is_by_event_time(bootstrap: str, topic_name: str) -> None:
    """Under lag, events are handled long after `created`; duplicates sent right after their
    originals are dropped by the new owner however late they are handled (the window is in event
    time and rebuilt from the log)."""
    from keyrange.kafkaio import TopicSpec, ensure_topics

    ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
    producer = make_producer(bootstrap)
    created = int(time.time() * 1000) - 30_000  # older than the TTL when handled
    records = [encode_input(1000 + i % 120, f"old-{i}", created, op="increment", amount=1) for i in range(300)]
    for key, value in records:
        producer.produce(topic_name, value, key, timestamp=created)
    assert producer.flush(30) == 0
    settings = dict(ttl_seconds=20.0, handler_config={})
    first = await run_worker_until(settings_for(bootstrap, topic_name, worker_id="a", **settings), "ledger", [0, 1],
                                   lambda w: w.stats.processed >= len(records))
    assert first.stats.processed == len(records)
    for key, value in records[:100]:
        producer.produce(topic_name, value, key, timestamp=created)
    assert producer.flush(30) == 0
    log = read_input_log(bootstrap, topic_name, len(records) + 100)
    second = await run_worker_until(settings_for(bootstrap, topic_name, worker_id="b", **settings), "ledger", [0, 1],
                                    lambda w: w.stats.consumed >= 100 and w.stats.pending == 0)
    assert second.stats.duplicates == 100
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", len(records)),
              read_counts(bootstrap, topic_name, f"{topic_name}-g"), ledger=True)


async def test_a_late_duplicate_after_the_handoff_of_an_idle_partition_is_dropped(bootstrap: str,
                                                                                 topic_name: str) -> None:
    """A partition idle since its committed offset keeps the window its last events gave it: a
    copy sent later carrying its original's `created` is dropped by the new owner as by the old
    one. (The restore used to read the window from now - TTL - slack, which on Apache Kafka finds
    nothing; tansu's offset lookup by append time hid it.)"""
    from keyrange.kafkaio import TopicSpec, ensure_topics

    ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
    producer = make_producer(bootstrap)
    created = int(time.time() * 1000) - 60_000  # the stream's time: a minute behind the wall clock
    records = [encode_input(1000 + i % 40, f"idle-{i}", created + i) for i in range(100)]
    for key, value in records:
        producer.produce(topic_name, value, key, timestamp=created)
    assert producer.flush(30) == 0
    first = await run_worker_until(settings_for(bootstrap, topic_name, worker_id="a"), "noop", [0, 1],
                                   lambda w: w.stats.processed >= len(records))
    assert first.stats.processed == len(records)
    second = Worker(settings_for(bootstrap, topic_name, worker_id="b"), load_handler("noop"))
    await second.start()
    try:
        await second.acquire([0, 1])  # nothing after the committed offsets: idle partitions
        for key, value in records[-10:]:  # sent again, as their producer retried them
            producer.produce(topic_name, value, key, timestamp=created)
        assert producer.flush(30) == 0
        await wait_for(lambda: second.stats.consumed >= 10 and second.stats.pending == 0, what="the copies")
    finally:
        await second.stop()
    assert second.stats.processed == 0
    assert second.stats.duplicates == 10


async def test_metrics_use_the_contract_names_and_labels(bootstrap: str, topic_name: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 1500, 3, clients=100, duplicate_ratio=0.05)
    distinct = len(first_occurrences(read_input_log(bootstrap, topic_name, sent)))
    settings = settings_for(bootstrap, topic_name, worker_id="m1")
    worker = Worker(settings, load_handler("noop"))
    await worker.start()
    labels = {"consumer": settings.group_id, "worker": "m1"}

    def total(name: str) -> float:
        return sum(REGISTRY.get_sample_value(name, {**labels, "partition": str(p)}) or 0.0 for p in range(3))

    try:
        await worker.acquire(range(3))
        await wait_for(lambda: worker.stats.processed >= distinct, what="all events")
        await worker.update_gauges()
        assert total("keyrange_events_consumed_total") == sent
        assert total("keyrange_events_processed_total") == distinct
        assert total("keyrange_duplicates_dropped_total") == sent - distinct
        assert total("keyrange_dedup_entries") == distinct
        assert total("keyrange_pending_events") == 0
        assert total("keyrange_consumer_lag") == 0
        assert total("keyrange_consumer_lag_seconds") == 0
        assert REGISTRY.get_sample_value("keyrange_event_latency_seconds_count", labels) == distinct
        assert REGISTRY.get_sample_value("keyrange_handler_seconds_count", labels) == distinct
        assert REGISTRY.get_sample_value("keyrange_held_slots", labels) == 3
    finally:
        await worker.stop()
    # Released partitions stop reporting gauges rather than freezing at stale values.
    assert REGISTRY.get_sample_value("keyrange_pending_events", {**labels, "partition": "0"}) is None


async def test_a_worker_started_before_any_event_handles_what_comes_later(bootstrap: str, topic_name: str) -> None:
    from keyrange.kafkaio import TopicSpec, ensure_topics

    ensure_topics(bootstrap, [TopicSpec(topic_name, 3)])
    worker = Worker(settings_for(bootstrap, topic_name), load_handler("noop"))
    await worker.start()
    try:
        await worker.acquire(range(3))
        await worker.update_gauges()  # idle partitions: nothing seen yet
        sent = await asyncio.to_thread(produce_stream, bootstrap, topic_name, 500, 3, 100, 0.05)
        log = read_input_log(bootstrap, topic_name, sent)
        distinct = len(first_occurrences(log))
        await wait_for(lambda: worker.stats.processed >= distinct, what="events produced after the start")
    finally:
        await worker.stop()
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", distinct),
              read_counts(bootstrap, topic_name, f"{topic_name}-g"))


async def test_events_without_created_are_deduplicated_by_record_time(bootstrap: str, topic_name: str) -> None:
    from keyrange.kafkaio import TopicSpec, ensure_topics

    ensure_topics(bootstrap, [TopicSpec(topic_name, 2)])
    producer = make_producer(bootstrap)
    now = int(time.time() * 1000)
    for i in range(300):  # each sent twice, interleaved with events that do carry `created`
        for body in ({"clientId": 1000 + i % 110, "uuid": f"bare-{i}"},
                     {"clientId": 1000 + i % 110, "uuid": f"full-{i}", "created": now}):
            producer.produce(topic_name, orjson.dumps(body), str(body["clientId"]).encode(), timestamp=now)
            producer.produce(topic_name, orjson.dumps(body), str(body["clientId"]).encode(), timestamp=now)
    assert producer.flush(30) == 0
    log = read_input_log(bootstrap, topic_name, 1200)
    worker = await run_worker_until(settings_for(bootstrap, topic_name), "noop", [0, 1],
                                    lambda w: w.stats.consumed >= 1200 and w.stats.processed >= 600)
    assert worker.stats.duplicates == 600
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 600),
              read_counts(bootstrap, topic_name, f"{topic_name}-g"))


async def test_offsets_commit_while_a_backlog_drains(bootstrap: str, topic_name: str) -> None:
    """Buffered records are fetched without suspending and inline handlers run during dispatch, so
    nothing in the fetch loop itself waits while a backlog drains: the loop must still give the
    commit loop its turns, and offsets commit as the backlog drains, not once it ran dry."""
    sent = produce_stream(bootstrap, topic_name, 30_000, PARTITIONS, clients=300, duplicate_ratio=0.0, ledger=True)
    settings = settings_for(bootstrap, topic_name, commit_interval_ms=20)
    worker = Worker(settings, load_handler("ledger"))
    # (records dispatched, events counted as processed: that happens when their transaction
    # commits), read from a thread every millisecond: a starved loop could not watch itself, and
    # asking Kafka for the committed offsets takes longer than a drain's commits are apart.
    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append((worker.stats.consumed, worker.stats.processed))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    await worker.start()
    try:
        watcher.start()
        await worker.acquire(range(PARTITIONS))
        await wait_for(lambda: worker.stats.processed >= sent, what="every event committed")
    finally:
        stop.set()
        await worker.stop()
        await asyncio.to_thread(watcher.join)
    committed_mid_drain = [(c, p) for c, p in seen if p > 0 and c < 0.9 * sent]
    first_commit = next(((c, p) for c, p in seen if p > 0), None)
    assert committed_mid_drain, (f"nothing committed while the backlog drained: the first commit came with "
                                 f"{first_commit} (dispatched, committed) of {sent}")
