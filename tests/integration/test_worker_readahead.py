"""The worker's Restorer (a pre-connected reader per acquire, offsets looked up by itself, logs read
ahead) restores exactly what `restore()` does from the committed offsets, acquire after acquire."""

from __future__ import annotations

import time
from unittest.mock import patch

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.ranges.slots import partition_for_key
from keyrange.worker import WorkerSettings
from keyrange.worker.restore import restore
from keyrange.worker.restorer import Prefetched, Restorer
from tests.integration.worker_helpers import run_worker_until, settings_for
from tests.kafkatools import offsets_committed_so_far

PARTITIONS = 4
WORKED = [0, 1, 2]
"""Partition 3 gets events but no worker: it has no committed offset."""


def _committed(settings: WorkerSettings) -> dict[int, int]:
    return offsets_committed_so_far(settings.bootstrap, settings.topic, settings.group_id, range(PARTITIONS))


def _produce(settings: WorkerSettings, seed: int) -> dict[int, int]:
    events = list(generate(LoadShape(clients=60, duplicate_ratio=0.05, ledger=True, seed=seed), count=3000))
    produce_all(settings.bootstrap, settings.topic, events)
    return {p: sum(1 for e in events if partition_for_key(e.key, PARTITIONS) == p) for p in range(PARTITIONS)}


async def test_restorer_matches_restore_from_committed_offsets_acquire_after_acquire(bootstrap: str,
                                                                                     topic_name: str) -> None:
    settings = settings_for(bootstrap, topic_name)
    ensure_topics(bootstrap, [TopicSpec(topic_name, PARTITIONS)])
    restorer: Restorer | None = None
    prefetched: Prefetched | None = None
    try:
        ends = dict.fromkeys(range(PARTITIONS), 0)
        for round_ in range(2):
            for p, n in _produce(settings, seed=11 + round_).items():
                ends[p] += n  # one offset per record: a plain producer writes no control records

            def committed_to_the_end(_worker: object) -> bool:
                committed = _committed(settings)
                return all(committed[p] == ends[p] for p in WORKED)

            worker = await run_worker_until(settings, "ledger", WORKED, committed_to_the_end)
            counts = dict(worker.partition_counts)
            if restorer is None:
                restorer = Restorer(settings, counts)
                restorer.connect_next_reader()
            committed = _committed(settings)
            assert committed[3] < 0, "partition 3 was never worked on"
            now_s = time.time()
            if prefetched is None:
                got = restorer.restore_slots(range(PARTITIONS), now_s=now_s)
            else:
                # Read ahead before round 2's events were produced and handled: only the rest is read now.
                with patch("keyrange.worker.restorer.restore_with", side_effect=AssertionError("read it all")):
                    got = restorer.restore_slots(range(PARTITIONS), prefetched, now_s=now_s)
            want = restore(settings, {**committed, 3: 0}, counts, now_s=now_s)
            assert got == want
            prefetched = restorer.prefetch(range(PARTITIONS))
            assert got[3].start_offset == 0 and not got[3].state
            assert all(got[p].start_offset == committed[p] > 0 for p in WORKED)
            assert sum(len(got[p].state) for p in WORKED) > 0, "the ledger handler keeps per-client state"
    finally:
        if restorer is not None:
            restorer.close()
