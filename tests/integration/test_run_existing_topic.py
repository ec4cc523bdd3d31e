"""`keyrange run -f` on a topic keyrange did not produce (issue 31, docs/input.md): string keys as
clientIds, the event id in a header, the event time in the record timestamp, and a value with
none of keyrange's own fields, through rescales.

The ledger handler runs as in test_run.py (inline on Apache Kafka, queued on tansu). About 1 % of
the commands are ones the ledger refuses, dead-lettered with maxRetries 0: a restore must find
their uuids in the dead letters (kept headers) with the same mapping, or a duplicate of one that
arrives after a handoff would be handled. Every guarantee checker runs with exact counts, and the
ledger oracle keys its counters by the text ids.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from keyrange.events import DLQ_REASON
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file
from tests.checkers import check_all
from tests.conftest import BrokerUnderTest
from tests.integration.fault_run import INLINE, QUEUED, wait_until
from tests.integration.supervised import ticking
from tests.kafkatools import read_counts, read_input_log, read_processed, read_topic

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: existing-topic}}
spec:
  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: 12}}
  input: {{clientId: key, uuid: "header:event-id", created: timestamp}}
  handler: ledger
  handlerConfig: {handler_config}
  maxRetries: 0
  concurrency: 32
  dedup: {{ttlSeconds: 60}}
  workers: {{min: 1, max: 4}}
  scaling: {{lagHighRecords: 1000000000, lagHighSeconds: 100000, lagLowRecords: 0, cooldownSeconds: 0, policy: step}}
"""

EVENTS = 15_000
RATE = 1_000
DUPLICATE_RATIO = 0.05


def produce_platform_topic(bootstrap: str, topic: str, stop: threading.Event, sent: list[int]) -> None:
    """Records as another team's service writes them: a text key, an `event-id` header, the time
    only in the record timestamp, and a value of the team's own shape."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    rng = random.Random(31)
    clients = [f"user-{rng.getrandbits(24):06x}" for _ in range(150)] + [f"kunde-ü{n}" for n in range(50)]
    recent: deque[dict[str, Any]] = deque(maxlen=2 * RATE)
    started = time.monotonic()
    for i in range(EVENTS):
        if stop.is_set():
            break
        roll = rng.random()
        if roll < 0.01:
            value = {"op": "refund-everything"}  # the ledger refuses it: a handler-error dead letter
        elif roll < 0.06:
            value = {"op": "drain"}
        else:
            value = {"op": "increment", "amount": rng.randint(1, 9)}
        record = {"key": rng.choice(clients).encode(), "value": orjson.dumps(value),
                  "headers": [("event-id", f"evt-{i:06d}".encode()), ("source", b"billing")]}
        producer.produce(topic, **record)
        recent.append(record)
        sent[0] += 1
        if rng.random() < DUPLICATE_RATIO:
            # A re-send of one of the last ~2 s of events (a later timestamp, the same event id), so
            # that duplicates straddle handoffs and the restored window must hold their originals.
            producer.produce(topic, **rng.choice(recent))
            sent[0] += 1
        if i % 50 == 49:
            producer.poll(0)
            ahead = (i + 1) / RATE - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # pacing the load, not waiting for a condition
    assert producer.flush(30) == 0, "the producer could not deliver every record"


@pytest.mark.slow
def test_run_consumes_an_existing_topic_through_rescales(broker_engine: BrokerUnderTest, topic_name: str,
                                                         tmp_path: Path) -> None:
    bootstrap = broker_engine.bootstrap
    path = tmp_path / "consumer.yaml"
    # The ledger as it ships (inline) on Kafka, queued on tansu, as in test_run.py.
    path.write_text(SPEC.format(topic=topic_name, handler_config=INLINE if broker_engine.engine == "kafka" else QUEUED))
    consumer = load_file(path)
    mapping = consumer.spec.input.mapping()
    supervisor = Supervisor(consumer, path, bootstrap, tmp_path / "run", tick_seconds=0.5)
    stop = threading.Event()
    sent = [0]
    load = threading.Thread(target=produce_platform_topic, args=(bootstrap, topic_name, stop, sent), daemon=True)
    with ticking(supervisor, stop) as controller:
        wait_until(lambda: 0 in controller.channel.state.reports and controller.channel.state.reports[0].held,
                   "worker 0 to hold its slots", 60)
        load.start()
        for i, direction in enumerate(["up", "up", "down", "up", "down", "down"]):
            result = controller.request_scale(direction, f"test {i}")  # type: ignore[arg-type]
            assert result.applied, result.detail
            wait_until(lambda: not (s := controller.status()).handoff_awaiting and not s.starting,
                       f"rescale {i} to complete")
        load.join(timeout=120)
        assert not load.is_alive()
        log = read_input_log(bootstrap, topic_name, sent[0], mapping=mapping)
        distinct = {e.uuid for e in log}
        refused = {e.uuid for e in log if e.body["op"] == "refund-everything"}
        processed = read_processed(bootstrap, f"{topic_name}.processed", len(distinct) - len(refused),
                                   timeout_seconds=120)
        dead_letters = read_topic(bootstrap, f"{topic_name}.dlq", len(refused))
        counts = read_counts(bootstrap, topic_name, f"{topic_name}-g", covering=len(log))
    assert len(controller.rescales) == 6
    assert refused and len(log) > len(distinct), "the load has no refused commands or no duplicates"
    # Each dead letter is its record, kept whole: the mapping reads its event id from it.
    dead_lettered = [mapping.parser.parse(m.key(), m.value(), m.headers(), 0).uuid for m in dead_letters]
    assert sorted(dead_lettered) == sorted(refused)
    assert {dict(m.headers() or [])[DLQ_REASON] for m in dead_letters} == {b"handler-error"}
    check_all(log, list(processed), counts, dead_lettered=dead_lettered, ledger=True)
    assert counts.dead_lettered == len(refused)
    assert len(processed) == len(distinct) - len(refused)
    texts = {r["clientId"] for r in processed}
    assert all(isinstance(c, str) for c in texts) and any(c.startswith("kunde-ü") for c in texts)
