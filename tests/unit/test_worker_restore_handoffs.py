"""Restoring hash-range slots from logs their owners wrote: siblings' transactions interleaved in the
shared changelog and sink partitions, snapshots, clients finishing out of order, each slot's last
transaction torn (tansu), a frozen owner's changelog records landing after its successor's (tansu),
and the read-ahead's seam (read ahead at any transaction's end, caught up at the grant). Every
restore must give the state every finished event left (tests/handoffsim.py)."""

from __future__ import annotations

from unittest.mock import patch

import pytest

from keyrange.worker.restorer import Restorer
from tests.handoffsim import COUNTS, NOW_S, SETTINGS, restore_from, simulate
from tests.logmodel import ModelReader

SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_full_restore_of_each_hash_range_gives_the_state_of_every_finished_event(seed: int) -> None:
    sim, _ = simulate(seed)
    slots = list(range(sim.layout.per_partition))
    committed, restored = restore_from(sim.logs, sim.layout, slots)
    for s in slots:
        assert restored[s].state == sim.expected_state(s, committed[s]), f"slot {s} from {committed[s]}"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_frozen_owners_changelog_records_landing_after_its_successors_do_not_take_a_client_back(seed: int) -> None:
    sim, _ = simulate(seed, late_writes=True)
    slots = list(range(sim.layout.per_partition))
    committed, restored = restore_from(sim.logs, sim.layout, slots)
    for s in slots:
        assert restored[s].state == sim.expected_state(s, committed[s]), f"slot {s} from {committed[s]}"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restore_caught_up_from_a_read_ahead_gives_what_a_full_restore_gives(seed: int) -> None:
    sim, ends = simulate(seed)
    slots = list(range(sim.layout.per_partition))
    committed, full = restore_from(sim.logs, sim.layout, slots)
    for sink_end, state_end in ends[:: max(1, len(ends) // 8)]:
        # What the logs held when the read-ahead read (the old owners still committing).
        before = dict(sim.logs)
        before[(SETTINGS.sink, 0)] = sim.logs[(SETTINGS.sink, 0)][:sink_end]
        before[(SETTINGS.state, 0)] = sim.logs[(SETTINGS.state, 0)][:state_end]
        for moved in ([0], slots):
            # The read-ahead's reader, then the acquire's.
            readers = [ModelReader(before), ModelReader(sim.logs)]
            with patch("keyrange.worker.restorer.LogReader", side_effect=readers):
                restorer = Restorer(SETTINGS, COUNTS, sim.layout)
                try:
                    prefetched = restorer.prefetch(moved, now_s=NOW_S)
                    restored = restorer.restore_slots(moved, prefetched, now_s=NOW_S)
                finally:
                    restorer.close()
            for s in moved:
                assert restored[s].start_offset == committed[s]
                assert restored[s].state == full[s].state == sim.expected_state(s, committed[s]), (
                    f"slot {s}, read ahead to sink {sink_end}, changelog {state_end}")
                assert restored[s].finished_offsets == full[s].finished_offsets
