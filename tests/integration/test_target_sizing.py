"""The target planner end to end under a step load, on Apache Kafka and on tansu: it reaches the
size the burst needs, merges back in the quiet phase, and never flaps (no split after a merge).

`keyrange run`'s supervisor runs in this process; workers are `keyrange worker` subprocesses. The
handler sleeps 10 ms with 2 permits per worker, so a worker handles about 200 ev/s: the burst of
450 ev/s needs at least 3 workers, the quiet 60 ev/s one. The planner decides on its own (nothing
calls `request_scale`); the test waits on conditions and asserts sizes and the guarantees, never
how fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase
from keyrange.ranges.controller import Rescale
from tests.checkers import check_all
from tests.conftest import BrokerUnderTest
from tests.integration.supervised import describe_status, supervised, wait_for
from tests.kafkatools import read_counts, read_input_log, read_processed

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: sizing}}
spec:
  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: 12}}
  handler: sleep
  handlerConfig: {{meanMs: 10, stddevMs: 1}}
  concurrency: 2
  workers: {{min: 1, max: 4}}
  scaling: {{lagHighSeconds: 5, cooldownSeconds: 10, policy: target}}
"""

PHASES = [Phase(10, 100), Phase(30, 450), Phase(35, 60)]
"""Quiet, a burst that needs 3 workers of about 200 ev/s, quiet again (one worker at 30 %)."""


def flaps(rescales: list[Rescale]) -> int:
    """How often the size turned from shrinking back to growing (2 -> 1 -> 2 is one)."""
    turns, shrunk = 0, False
    for r in rescales:
        if r.workers_after < r.workers_before:
            shrunk = True
        elif r.workers_after > r.workers_before and shrunk:
            turns, shrunk = turns + 1, False
    return turns


def test_flaps_counts_a_split_after_a_merge() -> None:
    def r(before: int, after: int) -> Rescale:
        return Rescale("", "", 0, before, after, frozenset(), 0, 0)

    assert flaps([r(1, 3), r(3, 4), r(4, 1)]) == 0
    assert flaps([r(2, 1), r(1, 2), r(2, 1)]) == 1


@pytest.mark.slow
def test_a_step_load_reaches_its_size_and_merges_back_without_flapping(
        broker_engine: BrokerUnderTest, topic_name: str, tmp_path: Path) -> None:
    bootstrap = broker_engine.bootstrap
    path = tmp_path / "consumer.yaml"
    path.write_text(SPEC.format(topic=topic_name))
    shape = LoadShape(rate=100, clients=200, duplicate_ratio=0.01, seed=7)
    with supervised(path, bootstrap, tmp_path / "run", shape, PHASES) as run:
        controller = run.controller
        wait_for(run.worker_holds_slots(0), 60, "worker 0 to hold its slots")
        run.load.start()
        run.load.join(timeout=300)
        assert not run.load.is_alive()
        wait_for(lambda: (s := controller.status()).map.workers == 1 and not s.handoff_awaiting and not s.starting,
                 180, lambda: f"the merge back to one worker: {describe_status(controller.status())}", interval=0.2)
        log = read_input_log(bootstrap, topic_name, run.totals.sent)
        processed = read_processed(bootstrap, f"{topic_name}.processed", len({e.uuid for e in log}),
                                   timeout_seconds=120)
        counts = read_counts(bootstrap, topic_name, f"{topic_name}-g", covering=len(log))
    rescales = list(controller.rescales)
    story = "; ".join(f"{r.workers_before}->{r.workers_after} ({r.reason})" for r in rescales)
    assert max(r.workers_after for r in rescales) >= 3, story
    assert flaps(rescales) == 0, story
    check_all(log, list(processed), counts)
