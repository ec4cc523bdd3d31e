"""What production needs from a worker besides the guarantees: hung handlers time out, outputs too
large for Kafka are dead-lettered instead of crash-looping the worker, dead letters too large for
their topic are truncated, liveness reflects the event loop, and memory is bounded in bytes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import orjson
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from keyrange.events import DLQ_DETAIL, DLQ_REASON, DLQ_TRUNCATED, MAX_EVENT_BYTES, encode_input, parse_input
from keyrange.handlers import load_handler
from keyrange.inputmapping import InputMapping
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.worker import Worker
from keyrange.worker.health import Health
from tests.checkers import check_all
from tests.integration.worker_handlers import FAIL_MARK
from tests.integration.worker_helpers import run_worker_until, settings_for, wait_for
from tests.kafkatools import read_counts, read_input_log, read_processed, read_topic

HANDLERS = "tests.integration.worker_handlers"


def produce(bootstrap: str, topic: str, bodies: list[dict[str, Any]], partitions: int = 1) -> None:
    ensure_topics(bootstrap, [TopicSpec(topic, partitions)])
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "message.max.bytes": 2_000_000})
    now = int(time.time() * 1000)
    for i, body in enumerate(bodies):
        key, value = encode_input(body.pop("clientId", 1000 + i % 20), body.pop("uuid", f"e{i}"), now, **body)
        producer.produce(topic, value, key, timestamp=now)
    assert producer.flush(30) == 0


async def test_a_hung_handler_times_out_is_retried_then_dead_lettered_and_its_client_goes_on(
        any_bootstrap: str, topic_name: str) -> None:
    bootstrap = any_bootstrap
    bodies = [{"clientId": 1000, "uuid": "hung", "mode": "hang"}] + [{"clientId": 1000 + i % 3} for i in range(60)]
    produce(bootstrap, topic_name, bodies)
    log = read_input_log(bootstrap, topic_name, len(bodies))
    settings = settings_for(bootstrap, topic_name, handler_timeout_seconds=0.5, max_retries=1, retry_backoff_ms=1)
    await run_worker_until(settings, f"{HANDLERS}:hangs_on_mark", [0], lambda w: w.stats.processed >= 60)
    dead = read_topic(bootstrap, f"{topic_name}.dlq", expect=1)
    headers = dict(dead[0].headers())
    assert headers[DLQ_REASON] == b"handler-error" and b"did not return within 0.5 s" in headers[DLQ_DETAIL]
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 60),
              read_counts(bootstrap, topic_name, settings.group_id, covering=61), dead_lettered=["hung"])
    labels = {"consumer": settings.group_id, "worker": settings.worker_id}
    assert REGISTRY.get_sample_value("keyrange_handler_timeouts_total", labels) == 2


async def test_a_release_does_not_wait_for_a_hung_call(bootstrap: str, topic_name: str) -> None:
    produce(bootstrap, topic_name, [{"clientId": 1000, "uuid": "hung", "mode": "hang"}])
    settings = settings_for(bootstrap, topic_name, handler_timeout_seconds=1.0, max_retries=100)
    worker = Worker(settings, load_handler(f"{HANDLERS}:hangs_on_mark"))
    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(lambda: worker.slots[0].running == 1, what="the hung call to start")
        began = time.monotonic()
        await worker.release([0])  # the in-flight attempt times out; a released slot is not retried here
        assert time.monotonic() - began < 10
        assert worker.held_slots == frozenset()
    finally:
        await worker.stop()


async def test_a_timed_out_sync_call_is_counted_until_its_thread_returns(bootstrap: str, topic_name: str) -> None:
    produce(bootstrap, topic_name, [{"clientId": 1000, "uuid": "slow", "mode": "slow", "sleepS": 2.5},
                                    *({"clientId": 1001} for _ in range(10))])
    settings = settings_for(bootstrap, topic_name, handler_timeout_seconds=0.3, max_retries=0, concurrency=2)
    worker = Worker(settings, load_handler(f"{HANDLERS}:sleeps_on_mark"))
    labels = {"consumer": settings.group_id, "worker": settings.worker_id}
    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(lambda: worker.stats.dead_letters == 1 and worker.stats.processed == 10,
                       what="the slow event dead-lettered and the others handled")
        assert REGISTRY.get_sample_value("keyrange_handler_calls_abandoned", labels) == 1
        alive, why = worker.health.liveness()
        assert not alive and "timed out and still hold their threads" in why  # 1 of concurrency 2
        await wait_for(lambda: REGISTRY.get_sample_value("keyrange_handler_calls_abandoned", labels) == 0,
                       what="the abandoned thread to return")
        assert worker.health.liveness() == (True, "ok")
    finally:
        await worker.stop()


async def test_outputs_too_large_for_kafka_go_to_the_dlq_and_the_worker_goes_on(
        any_bootstrap: str, topic_name: str) -> None:
    bootstrap = any_bootstrap
    bodies = [{"clientId": 1000, "uuid": "huge", "mode": "huge"}, {"clientId": 1001, "uuid": "big-state",
                                                                   "mode": "huge-state"}]
    bodies += [{"clientId": 1000 + i % 4} for i in range(40)]
    produce(bootstrap, topic_name, bodies)
    log = read_input_log(bootstrap, topic_name, len(bodies))
    settings = settings_for(bootstrap, topic_name)
    worker = await run_worker_until(settings, f"{HANDLERS}:huge_on_mark", [0],
                                    lambda w: w.stats.processed >= 40 and w.stats.dead_letters >= 2)
    dead = read_topic(bootstrap, f"{topic_name}.dlq", expect=2)
    reasons = Counter(dict(m.headers())[DLQ_REASON] for m in dead)
    assert reasons == {b"output-too-large": 2}
    # The state rides on the processed record too (restore.py), so a huge state makes that record huge.
    assert all(b"max.message.bytes of" in dict(m.headers())[DLQ_DETAIL] for m in dead)
    assert worker.stats.processed == 40
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 40),
              read_counts(bootstrap, topic_name, settings.group_id, covering=42), dead_lettered=["huge", "big-state"])


async def test_dead_letters_over_the_dlqs_limit_are_truncated_and_the_slot_keeps_committing(
        kafka_bootstrap: str, topic_name: str) -> None:
    """A dead letter copies its input; one over the DLQ's max.message.bytes used to fail every
    transaction of its slot, which was then given up, re-acquired and hit the same record."""
    bootstrap, dlq = kafka_bootstrap, f"{topic_name}.dlq"
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1, {"max.message.bytes": "2000000"}),
                              TopicSpec(dlq, 1, {"max.message.bytes": "100000"})])
    bodies = [{"clientId": 1000, "uuid": "failing-200k", "mode": FAIL_MARK, "pad": "f" * 200_000},
              {"clientId": 1001, "uuid": "oversized", "pad": "o" * (MAX_EVENT_BYTES + 200_000)}]
    # Each of these fits the DLQ alone, not two together: they must not share a record batch.
    bodies += [{"clientId": 1002 + i, "uuid": f"failing-60k-{i}", "mode": FAIL_MARK, "pad": "s" * 60_000}
               for i in range(3)]
    bodies += [{"clientId": 1000 + i % 4} for i in range(40)]
    produce(bootstrap, topic_name, bodies)
    log = read_input_log(bootstrap, topic_name, len(bodies))
    settings = settings_for(bootstrap, topic_name, max_retries=0)
    worker = await run_worker_until(settings, f"{HANDLERS}:sync_counter", [0],
                                    lambda w: w.stats.processed >= 40 and w.stats.dead_letters >= 5)
    assert worker.stats.processed == 40 and worker.stats.dead_letters == 5
    dead = {parse_input(m.value()).uuid if m.value() else "oversized": m for m in read_topic(bootstrap, dlq, expect=5)}
    assert sorted(dead) == ["failing-200k", "failing-60k-0", "failing-60k-1", "failing-60k-2", "oversized"]
    assert all(DLQ_TRUNCATED not in dict(dead[f"failing-60k-{i}"].headers()) for i in range(3))
    failing, oversized = dead["failing-200k"], dead["oversized"]
    original = read_topic(bootstrap, topic_name, expect=len(bodies))[0].value()
    assert int(dict(failing.headers())[DLQ_TRUNCATED]) == len(original)
    assert parse_input(failing.value()).uuid == "failing-200k"  # what a restore rebuilds the window from
    assert oversized.value() is None and int(dict(oversized.headers())[DLQ_TRUNCATED]) > MAX_EVENT_BYTES
    check_all(log, read_processed(bootstrap, f"{topic_name}.processed", 40),
              read_counts(bootstrap, topic_name, settings.group_id, covering=len(bodies)),
              dead_lettered=sorted(dead))


async def test_a_truncated_dead_letter_under_an_input_mapping_keeps_the_events_identity(
        kafka_bootstrap: str, topic_name: str) -> None:
    """Under a mapping the identity is the mapping's: a text clientId from a header, the uuid from a
    nested field, the record's timestamp. It used to be dropped, leaving the DLQ no way to name the event."""
    bootstrap, dlq = kafka_bootstrap, f"{topic_name}.dlq"
    ensure_topics(bootstrap, [TopicSpec(topic_name, 1, {"max.message.bytes": "2000000"}),
                              TopicSpec(dlq, 1, {"max.message.bytes": "100000"})])
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 2_000_000})
    for i in range(11):
        body = {"meta": {"id": f"e{i}"}, **({"mode": FAIL_MARK, "pad": "f" * 200_000} if i == 0 else {})}
        producer.produce(topic_name, orjson.dumps(body), b"k", headers=[("account", b"acct-7")], timestamp=1_000 + i)
    assert producer.flush(30) == 0
    mapping = InputMapping(client_id="header:account", uuid="field:meta.id", created="timestamp")
    settings = settings_for(bootstrap, topic_name, max_retries=0, input_mapping=mapping)
    await run_worker_until(settings, f"{HANDLERS}:sync_counter", [0],
                           lambda w: w.stats.processed >= 10 and w.stats.dead_letters >= 1)
    (dead,) = read_topic(bootstrap, dlq, expect=1)
    assert int(dict(dead.headers())[DLQ_TRUNCATED]) > 200_000
    assert orjson.loads(dead.value()) == {"clientId": "acct-7", "uuid": "e0", "created": 1_000}


async def test_liveness_fails_while_the_event_loop_is_blocked(bootstrap: str, topic_name: str) -> None:
    produce(bootstrap, topic_name, [{"clientId": 1000, "uuid": "block", "mode": "block", "blockS": 3.0}])
    settings = settings_for(bootstrap, topic_name)
    health = Health(stale_after_seconds=1.0)
    worker = Worker(settings, load_handler(f"{HANDLERS}:blocks_the_loop"), health=health)
    seen: list[bool] = []
    stop = threading.Event()

    def probe() -> None:  # as the kubelet does: from outside the event loop
        while not stop.wait(0.1):
            seen.append(health.liveness()[0])

    await worker.start()
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        assert health.readiness()[0]
        await worker.acquire([0])
        await wait_for(lambda: worker.stats.processed == 1, what="the blocking event")
        await wait_for(lambda: False in seen and seen[-1] is True, what="liveness to fail and then recover")
    finally:
        stop.set()
        prober.join()
        await worker.stop()
    assert False in seen, "liveness never failed while the loop was blocked for 3 s"
    assert seen[-1] is True


async def test_memory_is_bounded_in_bytes_not_only_in_events(bootstrap: str, topic_name: str) -> None:
    bodies = [{"clientId": 1000 + i % 50, "pad": "p" * 20_000} for i in range(400)]  # ~8 MB
    produce(bootstrap, topic_name, bodies)
    settings = settings_for(bootstrap, topic_name, max_pending=100_000, max_pending_bytes=256 * 1024,
                            fetch_batch_size=20, handler_config={"meanMs": 2, "stddevMs": 0})
    worker = Worker(settings, load_handler("sleep", settings.handler_config))
    peak = 0

    def sample() -> bool:
        nonlocal peak
        peak = max([peak] + [slot.pending_bytes for slot in worker.slots.values()])
        return worker.stats.processed >= 400

    await worker.start()
    try:
        await worker.acquire([0])
        await wait_for(sample, what="every large event")
    finally:
        await worker.stop()
    assert worker.stats.pauses > 0
    # Paused before the next fetch once over the limit: at most one fetch batch (20 x ~20 KB) over.
    assert peak <= 256 * 1024 + 20 * 21_000
