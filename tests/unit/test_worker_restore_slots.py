"""Restoring slots that are hash ranges inside a partition (worker/restore.py, positions.py): each
slot takes of its partition's logs only its own clients' records, resumes from its own totals
record, and a whole partition restores as it always did."""

from __future__ import annotations

from typing import Any

from keyrange.events import (
    DLQ_OFFSET,
    DLQ_PARTITION,
    GROUP_HEADER,
    SNAPSHOT_HEADER,
    SOURCE_OFFSET_HEADER,
    STATE_HEADER,
    TOTALS_KEY,
    encode_input,
    encode_totals,
    is_totals_key,
    json_bytes,
    totals_key,
)
from keyrange.ranges.layout import SlotLayout
from keyrange.worker.commitwindow import Outcome, Totals
from keyrange.worker.positions import slot_starts
from keyrange.worker.restore import ParsedLogs, RestoredPartition, fold_logs
from keyrange.worker.settings import WorkerSettings
from tests.fake_message import FakeMessage
from tests.logmodel import ModelReader, Record

SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="in", group_id="g")
GROUP = (GROUP_HEADER, b"g")
LAYOUT = SlotLayout(1, 2)
CLIENTS = range(20)
EVENTS = 40
COMMITTED = {0: 30, 1: 24}
"""Where each slot of partition 0 resumes."""
FINISHED_PAST = {25, 26, 31, 32, 33, 35, 38}
"""Offsets whose outputs exist: past their slot's committed offset, except 25 (slot 0's, below 30),
whose output neither slot takes (one is a dead letter)."""
DEAD = 31


def client_at(offset: int) -> int:
    return offset % len(CLIENTS)


def slot_at(offset: int) -> int:
    return LAYOUT.slot_for_key(0, str(client_at(offset)).encode())


def logs() -> dict[tuple[str, int], list[Any]]:
    inputs, processed, dead, changelog = [], [], [], []
    for o in range(EVENTS):
        key, value = encode_input(client_at(o), f"u{o}", 1_000 + o)
        inputs.append(FakeMessage(o, key, value, None, 1_000 + o))
        if o in FINISHED_PAST and o == DEAD:
            headers = [(DLQ_PARTITION, b"0"), (DLQ_OFFSET, str(o).encode()), GROUP]
            dead.append(FakeMessage(len(dead), key, value, headers))
        elif o in FINISHED_PAST:
            record = json_bytes({"clientId": client_at(o), "uuid": f"u{o}", "created": 1_000 + o, "partition": 0,
                                 "offset": o, "result": None})
            processed.append(FakeMessage(len(processed), key, record, [GROUP, (STATE_HEADER, json_bytes(o))]))
        if o < COMMITTED[slot_at(o)]:
            changelog.append(FakeMessage(len(changelog), key, json_bytes(o), [(SOURCE_OFFSET_HEADER, str(o).encode())]))
    for slot, committed in COMMITTED.items():
        for counted_to, handled in ((committed - 10, 1), (committed, 7 + slot)):
            changelog.append(FakeMessage(len(changelog), totals_key(slot, 2), encode_totals(handled, 0, 0),
                                         [(SOURCE_OFFSET_HEADER, str(counted_to).encode())]))
    # A whole partition's totals record (as one slot per partition writes): not any hash range's.
    changelog.append(FakeMessage(len(changelog), TOTALS_KEY, encode_totals(99, 0, 0), [(SOURCE_OFFSET_HEADER, b"28")]))
    return {("in", 0): inputs, ("in.processed", 0): processed, ("in.dlq", 0): dead, ("g.state", 0): changelog}


def restored(layout: SlotLayout, committed: dict[int, int]) -> dict[int, RestoredPartition]:
    parsed = ParsedLogs()
    for span, messages in logs().items():
        parsed.add(SETTINGS, span, messages)  # type: ignore[arg-type]
    return fold_logs(committed, parsed, layout)


def test_each_slot_restores_only_its_own_clients() -> None:
    # The layout routes these offsets so: the outputs above fall on both sides of each slot's offset.
    assert [o for o in sorted(FINISHED_PAST) if slot_at(o) == 1] == [26, 31, 38]
    slots = restored(LAYOUT, COMMITTED)
    for slot, committed in COMMITTED.items():
        mine = [o for o in range(EVENTS) if slot_at(o) == slot]
        r = slots[slot]
        assert r.start_offset == committed
        assert r.seen == [(f"u{o}", (1_000 + o) / 1000) for o in mine if o < committed]
        assert sorted(r.finished_offsets) == sorted(o for o in FINISHED_PAST if o in mine and o >= committed)
        assert set(r.state) == {client_at(o) for o in mine}
        assert r.totals == Totals(7 + slot, 0, 0)


def test_a_dead_letter_and_a_state_belong_to_the_slot_of_their_client() -> None:
    slots = restored(LAYOUT, COMMITTED)
    owner = slots[slot_at(DEAD)]
    assert owner.start_offset <= DEAD
    assert owner.finished_offsets[DEAD].outcome is Outcome.DEAD_LETTERED
    assert DEAD not in slots[1 - slot_at(DEAD)].finished_offsets
    for o in FINISHED_PAST - {DEAD}:
        r = slots[slot_at(o)]
        if o >= r.start_offset:
            # The state after a finished event past the committed offset comes from its processed record.
            assert r.state[client_at(o)] == max(x for x in FINISHED_PAST - {DEAD} if client_at(x) == client_at(o)
                                                and x >= r.start_offset)


def test_a_whole_partition_restores_everything_as_before() -> None:
    whole = restored(SlotLayout(1), {0: 24})[0]
    assert whole.seen == [(f"u{o}", (1_000 + o) / 1000) for o in range(24)]
    assert sorted(whole.finished_offsets) == sorted(FINISHED_PAST)
    assert whole.totals == Totals()  # its own key counts past 24: a transaction whose offsets did not commit
    assert set(whole.state) == set(CLIENTS)


def test_totals_keys_name_the_slot_and_are_never_a_client() -> None:
    assert totals_key(0, 1) == TOTALS_KEY
    assert totals_key(1, 4) == b"keyrange.totals.1/4"
    assert is_totals_key(TOTALS_KEY) and is_totals_key(b"keyrange.totals.3/8")
    assert not is_totals_key(b"keyrange.totalsx") and not is_totals_key(b"17") and not is_totals_key(None)


def totals_record(offset: int, key: bytes, counted_to: int, snapshot: int | None = None) -> Record:
    headers = [(SOURCE_OFFSET_HEADER, str(counted_to).encode())]
    if snapshot is not None:
        headers.append((SNAPSHOT_HEADER, str(snapshot).encode()))
    return Record(offset, 0, 0, encode_totals(counted_to, 0, 0), key, headers)


def test_a_hash_range_resumes_from_its_newest_totals_record_and_a_whole_partition_from_the_group() -> None:
    layout = SlotLayout(2, 2)
    state = [totals_record(0, totals_key(0, 2), 5), totals_record(1, totals_key(1, 2), 9),
             totals_record(2, totals_key(0, 2), 12), totals_record(3, b"17", 0)]
    reader = ModelReader({("g.state", 0): state}, committed={0: 4, 1: 3})
    # Slot 3 (partition 1's upper half) has no totals record: the group's offset, never past any slot's.
    assert slot_starts(reader, "in", "g.state", [0, 1, 3], layout) == {0: 12, 1: 9, 3: 3}  # type: ignore[arg-type]
    assert slot_starts(reader, "in", "g.state", [0, 1], SlotLayout(2)) == {0: 4, 1: 3}  # type: ignore[arg-type]
