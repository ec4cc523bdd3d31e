"""Routing a fetched batch to the held slots in one pass (worker/routing.py), against the
record-by-record routing it replaces, on real slot states (no Kafka)."""

from __future__ import annotations

import itertools
import random

from confluent_kafka import KafkaError, Message

from keyrange.ranges.layout import SlotLayout, SlotRouter
from keyrange.worker.routing import BatchRouter
from keyrange.worker.slot import SlotState
from keyrange.worker.transactions import OutputRecord
from tests.slotstate import held_hash_range

LAYOUT = SlotLayout(2, 4)
"""2 partitions of 4 hash ranges: slots 0-3 on partition 0, 4-7 on partition 1."""


def record(partition: int, offset: int, key: bytes | None) -> Message:
    return Message(topic="in", partition=partition, offset=offset, key=key, value=b"{}")


def key_of_slot(slot: int, skip: int = 0) -> bytes:
    """A clientId key that routes to `slot` (the `skip`-th such key)."""
    p = LAYOUT.partition_of(slot)
    keys = (k for c in itertools.count() if LAYOUT.slot_for_key(p, k := str(c).encode()) == slot)
    return next(itertools.islice(keys, skip, None))


def held(*slots: int) -> dict[int, list[SlotState]]:
    by_partition: dict[int, list[SlotState]] = {}
    for s in slots:
        by_partition.setdefault(LAYOUT.partition_of(s), []).append(held_hash_range(LAYOUT, s))
    return by_partition


def dispatch(routing: BatchRouter[SlotState], batch: list[Message]) -> list[tuple[int, int]]:
    """What the engine does with a batch, the intake reduced to admitting the offset; the
    (slot, offset) admitted, in order."""
    routed = routing.route(batch)
    admitted = [(slot.slot, m.offset()) for slot, m in routed.own if slot.admit(m.offset(), 0, 0)]  # type: ignore[arg-type]
    routing.pass_ends(routed.ends)
    return admitted


def test_a_batch_goes_to_its_held_slots_in_fetch_order_and_the_others_records_are_skipped() -> None:
    slots = held(1, 2, 5)
    routing = BatchRouter(SlotRouter(LAYOUT), slots)
    batch = [record(0, 0, key_of_slot(1)), record(0, 1, key_of_slot(0)), record(1, 0, key_of_slot(5)),
             record(0, 2, key_of_slot(2)), record(0, 3, key_of_slot(3)), record(1, 1, key_of_slot(6)),
             record(0, 4, key_of_slot(1, 1))]
    routed = routing.route(batch)
    assert [(slot.slot, m.partition(), m.offset()) for slot, m in routed.own] == [
        (1, 0, 0), (5, 1, 0), (2, 0, 2), (1, 0, 4)]
    assert routed.errors == []
    # Each partition's last record in the batch: where its held slots are passed to.
    assert {p: m.offset() for p, m in routed.ends.items()} == {0: 4, 1: 1}


def test_once_its_own_records_are_admitted_each_held_slot_passes_the_batchs_last_offset() -> None:
    slots = held(0, 2)
    s0, s2 = slots[0]
    routing = BatchRouter(SlotRouter(LAYOUT), slots)
    # 0: slot 0's; 1-3: other workers'; 4: slot 2's; 5-6: other workers'.
    batch = [record(0, 0, key_of_slot(0)), record(0, 1, key_of_slot(1)), record(0, 2, key_of_slot(3)),
             record(0, 3, key_of_slot(1, 1)), record(0, 4, key_of_slot(2)), record(0, 5, key_of_slot(3, 1)),
             record(0, 6, key_of_slot(1))]
    assert dispatch(routing, batch) == [(0, 0), (2, 4)]
    # Neither moves past its own unfinished record; past them, each is at the batch's end.
    assert (s0.committable, s0.next_offset, s2.committable, s2.next_offset) == (0, 7, 4, 7)
    s0.finish_processed(0, OutputRecord("out", 0, b"k", b"{}"), 1, None, False)
    s2.finish_processed(4, OutputRecord("out", 0, b"k", b"{}"), 1, None, False)
    assert (s0.committable, s2.committable) == (7, 7)
    # A batch of only other workers' records moves both, once.
    assert dispatch(routing, [record(0, o, key_of_slot(1)) for o in range(7, 12)]) == []
    assert (s0.committable, s2.committable) == (12, 12)


def test_a_revoked_slot_is_not_passed_and_its_own_records_go_to_it_to_be_refused() -> None:
    slots = held(0, 1)
    s0, s1 = slots[0]
    routing = BatchRouter(SlotRouter(LAYOUT), slots)
    assert dispatch(routing, [record(0, 0, key_of_slot(2))]) == []
    s1.revoke()  # being released: its next owner handles its records from its committed position
    routed = routing.route([record(0, 1, key_of_slot(1)), record(0, 2, key_of_slot(2))])
    assert [(slot.slot, m.offset()) for slot, m in routed.own] == [(1, 1)]
    routing.pass_ends(routed.ends)
    assert not s1.admit(1, 0, 0)
    assert (s0.committable, s1.committable) == (3, 1)


def test_errors_unheld_partitions_and_keyless_records() -> None:
    slots = held(4)
    routing = BatchRouter(SlotRouter(LAYOUT), slots)
    error = Message(topic="in", partition=1, error=KafkaError(KafkaError._TRANSPORT))
    routed = routing.route([record(0, 0, key_of_slot(0)), error, record(1, 0, None), record(1, 1, key_of_slot(5))])
    # Partition 0 is not held: skipped, no pass. A record without a key is its partition's first slot's.
    assert [(slot.slot, m.offset()) for slot, m in routed.own] == [(4, 0)]
    assert routed.errors == [error] and list(routed.ends) == [1]


def test_whole_partitions_take_every_record_of_theirs_without_reading_keys() -> None:
    layout = SlotLayout(3)
    slots = {p: [held_hash_range(layout, p)] for p in (0, 2)}
    routing = BatchRouter(SlotRouter(layout), slots)
    routed = routing.route([record(p, o, None if o else b"k") for o in range(3) for p in range(3)])
    assert [(slot.slot, m.offset()) for slot, m in routed.own] == [(0, 0), (2, 0), (0, 1), (2, 1), (0, 2), (2, 2)]
    assert routed.ends == {}  # nothing to pass: every record of a whole partition is its slot's


def per_record_reference(by_partition: dict[int, list[SlotState]], batch: list[Message]) -> list[tuple[int, int]]:
    """The routing the batch router replaced: each record in turn, passing the partition's other
    unrevoked held slots past its offset."""
    admitted = []
    for m in batch:
        if m.error() is not None:
            continue
        p, offset = m.partition(), m.offset()
        slot = LAYOUT.slot_for_key(p, m.key())  # type: ignore[arg-type]
        for candidate in by_partition.get(p, []):  # type: ignore[call-overload]
            if candidate.slot == slot:
                if candidate.admit(offset, 0, 0):  # type: ignore[arg-type]
                    admitted.append((slot, offset))
            elif not candidate.revoked:
                candidate.pass_offset(offset)  # type: ignore[arg-type]
    return admitted


def test_random_batches_finishes_refetches_and_revocations_match_record_by_record_routing() -> None:
    rng = random.Random(28)
    keys = [str(c).encode() for c in range(500)]
    for trial in range(60):
        held_slots = rng.sample(range(LAYOUT.slot_count), rng.randint(1, 5))
        batched, reference = held(*held_slots), held(*held_slots)
        routing = BatchRouter(SlotRouter(LAYOUT), batched)
        unfinished: set[tuple[int, int]] = set()
        ends = [0, 0]
        for _ in range(rng.randint(1, 12)):
            runs = []
            for p in (0, 1):
                if rng.random() < 0.2:
                    ends[p] = max(0, ends[p] - rng.randint(1, 30))  # fetched again from lower (a sibling joined)
                n = rng.randint(0, 60)
                runs.append([record(p, o, rng.choice(keys)) for o in range(ends[p], ends[p] + n)])
                ends[p] += n + rng.randint(0, 2)  # gaps: transaction markers
            errors = [Message(topic="in", partition=rng.randint(0, 1), error=KafkaError(KafkaError._TRANSPORT))
                      for _ in range(rng.randint(0, 2))]
            batch = _interleave(rng, *runs, errors)
            admitted = dispatch(routing, batch)
            assert admitted == per_record_reference(reference, batch), trial
            unfinished.update(admitted)
            for s, offset in rng.sample(sorted(unfinished), min(len(unfinished), rng.randint(0, 8))):
                for states in (batched, reference):
                    _slot(states, s).finish_processed(offset, OutputRecord("out", 0, b"k", b"{}"), 1, None, False)
                unfinished.discard((s, offset))
            for s in held_slots:
                mine, theirs = _slot(batched, s), _slot(reference, s)
                assert (mine.committable, mine.next_offset, mine.pending) == \
                       (theirs.committable, theirs.next_offset, theirs.pending), (trial, s)
                # Never past an own record that is not finished.
                assert all(mine.committable <= o for slot, o in unfinished if slot == s), (trial, s)
            if rng.random() < 0.15:
                victim = rng.choice(held_slots)
                for states in (batched, reference):
                    _slot(states, victim).revoke()


def _interleave(rng: random.Random, *runs: list[Message]) -> list[Message]:
    """The runs merged at random, each keeping its order (as partitions interleave in a fetch)."""
    queues = [list(reversed(run)) for run in runs]
    merged = []
    while any(queues):
        merged.append(rng.choice([q for q in queues if q]).pop())
    return merged


def _slot(by_partition: dict[int, list[SlotState]], slot: int) -> SlotState:
    return next(s for slots in by_partition.values() for s in slots if s.slot == slot)
