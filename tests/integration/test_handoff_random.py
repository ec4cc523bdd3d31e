"""Random handoff schedules: every guarantee holds whatever the seed throws at the system.

Each seed (handoff_chaos.Schedule) mixes bursts, trickles and pauses with split and merge
requests (some during a handoff, some while the old owner lags far behind), a SIGKILL of a
worker and of the controller, on worker and controller processes, against tansu and Apache Kafka.
The seed also picks the handler: the ledger queued (5 ms of simulated I/O), or inline and slow
(0.3 ms of CPU that holds the worker's loop: its fetches, commits and handoff steps). Every seed
is checked with the shared checkers: order per client, no loss, no duplicate handling, the ledger
oracle, and the exact accounting (handled + dead-lettered = unique input; duplicates dropped =
input duplicates, from the totals committed with the offsets).

Each seed also runs on a consumer with fewer partitions than workers: 2 partitions and
`workers.max: 6`, so the controller cuts each partition into 3 hash-range slots of clientIds
(SlotLayout) and every split and merge past 2 workers moves a part of a partition's clients.

CI runs a fixed set of seeds; `make soak` runs many (KEYRANGE_CHAOS_SEEDS=1-40). A failing seed
prints itself, its schedule and how to replay it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.slots import parse_slot_list
from tests.checkers import check_all
from tests.integration.handoff_chaos import (
    MAX_WORKERS,
    PARTITIONS,
    ChaosRun,
    Schedule,
    lost_per_slot,
    processed_read_to,
    slot_story,
)
from tests.kafkatools import control_slot_count, read_counts, read_input_log, read_processed

CI_SEEDS = "3,8"
LAYOUTS = {"whole-partitions": (PARTITIONS, MAX_WORKERS), "hash-ranges": (2, 6)}
"""(partitions, workers.max): a slot per partition, or 3 hash-range slots per partition."""


def seeds() -> list[int]:
    """The seeds to run: `KEYRANGE_CHAOS_SEEDS` as a list like `1-40` or `3,8,21`, else CI's."""
    return parse_slot_list(os.environ.get("KEYRANGE_CHAOS_SEEDS", CI_SEEDS))


@pytest.mark.slow
@pytest.mark.parametrize("seed", seeds(), ids=lambda s: f"seed-{s}")
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_random_handoffs_keep_every_guarantee(any_bootstrap: str, topic_name: str, tmp_path: Path,
                                              layout: str, seed: int) -> None:
    bootstrap = any_bootstrap
    partitions, max_workers = LAYOUTS[layout]
    schedule = Schedule.from_seed(seed)
    print(schedule.describe())
    run = ChaosRun(bootstrap, topic_name, tmp_path / "run", schedule, partitions, max_workers)
    run.start()
    try:
        produced = run.play()
        run.settle()
        log = read_input_log(bootstrap, topic_name, produced.records)
        distinct = len({e.uuid for e in log})
        processed = read_processed(bootstrap, f"{topic_name}.processed", distinct, timeout_seconds=90)
        counts = read_counts(bootstrap, topic_name, run.group, covering=len(log), timeout_seconds=30)
        epoch = run.epoch()
        slot_count = control_slot_count(bootstrap, run.group)
    finally:
        run.stop()
    try:
        assert len(log) == produced.records
        assert slot_count == SlotLayout.for_workers(partitions, max_workers).slot_count
        check_all(log, list(processed), counts, ledger=True)
    except AssertionError as exc:
        lost = lost_per_slot(log, list(processed), partitions, slot_count)
        raise AssertionError(
            f"{schedule.describe()}\nkills: {run.kills}\nrequests: {run.requests}\nlogs: {run.workdir}\n"
            f"replay: KEYRANGE_CHAOS_SEEDS={seed} python -m pytest -p no:cacheprovider "
            f"tests/integration/test_handoff_random.py\n{exc}\n"
            f"lost per slot: {lost}\nprocessed topic now reads {processed_read_to(bootstrap, topic_name)}\n"
            f"what the logs say of those slots:\n{slot_story(run.workdir, lost)}") from exc
    workers_per_partition = {p: len({r["worker"] for r in processed if r["partition"] == p})
                             for p in range(partitions)}
    print(f"seed {seed} ({layout}): workers that handled each partition {workers_per_partition}")
    print(f"seed {seed}: {len(log):,} records, {produced.duplicates:,} duplicates, kills {run.kills}, "
          f"{sum('true' in r for r in run.requests)} forced rescales applied, final epoch {epoch} "
          f"(two epochs per rescale)")
