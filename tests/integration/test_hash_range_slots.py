"""More workers than partitions, on Apache Kafka and on tansu: a 1-partition topic with
`workers.max: 4` is cut into 4 hash-range slots, the planner spreads them over 4 workers under load
and merges them back, and every guarantee holds (check_all: order, no loss, dedup, exact counts).

The group's committed offset, which users' tools read, reaches the end of the log.

`keyrange run`'s supervisor runs in this process; workers are `keyrange worker` subprocesses. The
handler sleeps 10 ms with 2 permits per worker, about 200 ev/s a worker: the burst of 600 ev/s
needs 3 or more. The test waits on conditions and asserts sizes and the guarantees, never how fast.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase
from keyrange.ranges.layout import SlotLayout
from tests.checkers import check_all
from tests.conftest import BrokerUnderTest
from tests.integration.supervised import supervised, wait_for
from tests.kafkatools import committed_offsets, control_slot_count, read_counts, read_input_log, read_processed

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: hashranges}}
spec:
  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: 1}}
  handler: ledger
  handlerConfig: {{delayMs: 10}}
  concurrency: 2
  dedup: {{ttlSeconds: 120}}
  workers: {{min: 1, max: 4}}
  scaling: {{lagHighSeconds: 3, cooldownSeconds: 5, policy: target}}
"""

PHASES = [Phase(5, 100), Phase(25, 600), Phase(20, 40)]
"""Quiet, a burst that needs 3 or 4 workers of about 200 ev/s on one partition, quiet again."""


@pytest.mark.slow
def test_one_partition_runs_on_four_workers_with_every_guarantee(
        broker_engine: BrokerUnderTest, topic_name: str, tmp_path: Path) -> None:
    bootstrap = broker_engine.bootstrap
    path = tmp_path / "consumer.yaml"
    path.write_text(SPEC.format(topic=topic_name))
    shape = LoadShape(rate=100, clients=300, duplicate_ratio=0.02, ledger=True, seed=11)
    with supervised(path, bootstrap, tmp_path / "run", shape, PHASES) as run:
        controller = run.controller
        assert controller.layout == SlotLayout(1, 4)
        wait_for(run.worker_holds_slots(0), 60, "worker 0 to hold its slots")
        run.load.start()
        wait_for(lambda: controller.status().map.workers >= 3, 120,
                 f"three or more workers on one partition: {controller.status().last_decision}", interval=0.2)
        run.finish_load(timeout_seconds=180)
        log = read_input_log(bootstrap, topic_name, run.totals.sent)
        # Users' tools read the group's offset: the lowest of the partition's slots, so at the end
        # of the log once every slot finished (the controller commits it every second).
        wait_for(lambda: committed_offsets(bootstrap, topic_name, f"{topic_name}-g") == {0: len(log)}, 300,
                 f"the group's committed offset to reach the end of the log ({len(log)})", interval=0.5)
        processed = read_processed(bootstrap, f"{topic_name}.processed", len({e.uuid for e in log}),
                                   timeout_seconds=120)
        counts = read_counts(bootstrap, topic_name, f"{topic_name}-g", covering=len(log))
    story = "; ".join(f"{r.workers_before}->{r.workers_after} ({r.reason})" for r in controller.rescales)
    assert control_slot_count(bootstrap, f"{topic_name}-g") == 4
    check_all(log, list(processed), counts, ledger=True)
    assert len(processed) == len({e.uuid for e in log})
    by_worker = Counter(record["worker"] for record in processed)
    assert len(by_worker) >= 3, f"processed by {dict(by_worker)}; {story}"
    assert {record["partition"] for record in processed} == {0}
