"""A restore's log line says what it restored each slot from, so that a state lost in a handoff can be
walked back to the restore that lost it: where the slot resumes (and from where a read-ahead began),
the totals record it took, what it folded, the offsets finished past it, the states it writes again
and the offsets of every log it read."""

from __future__ import annotations

from keyrange.events import SOURCE_OFFSET_HEADER, encode_totals, json_bytes, totals_key
from keyrange.ranges.layout import SlotLayout
from keyrange.worker.restore import ParsedLogs, describe_restore, fold_logs
from keyrange.worker.settings import WorkerSettings
from tests.logmodel import FakeMessage, Record

SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="in", group_id="g")
LAYOUT = SlotLayout(1, 2)


def changelog(offset: int, key: bytes, value: bytes, source: int) -> FakeMessage:
    headers = [(SOURCE_OFFSET_HEADER, str(source).encode())]
    return FakeMessage((SETTINGS.state, 0), Record(offset, 0, 0, value, key, headers))


def test_a_restore_says_where_each_slot_resumes_what_it_took_and_which_offsets_it_read() -> None:
    slot = LAYOUT.slot_for_key(0, b"7")
    logs = ParsedLogs()
    logs.add(SETTINGS, (SETTINGS.state, 0), [
        changelog(40, b"7", json_bytes(3), 11),
        changelog(41, totals_key(slot % 2, 2), encode_totals(12, 0, 0), 12),
    ])
    logs.add(SETTINGS, (SETTINGS.state, 0), [changelog(42, b"7", json_bytes(5), 13)])
    restored = fold_logs({slot: 12}, logs, LAYOUT)

    line = describe_restore(SETTINGS, restored, logs, LAYOUT, read_ahead_from={slot: 10})

    assert line == (f"{LAYOUT.describe_slot(slot)} from 12 (read ahead from 10): totals counting to 12, "
                    "3 changelog records, 1 client states, 0 uuids, none past it; read changelog[0] 40-43")
