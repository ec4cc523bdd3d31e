"""The restore under an input mapping (worker/restore.py): it reads uuids and times from the input
and from dead letters with the intake's own mapping, and keys restored state by text ids."""

from __future__ import annotations

from typing import Any

from keyrange.events import DLQ_OFFSET, DLQ_PARTITION, GROUP_HEADER, SOURCE_OFFSET_HEADER, STATE_HEADER, json_bytes
from keyrange.inputmapping import InputMapping, record_headers
from keyrange.worker.commitwindow import Outcome
from keyrange.worker.restore import ParsedLogs, fold_logs
from keyrange.worker.settings import WorkerSettings
from tests.fake_message import FakeMessage

MAPPING = InputMapping(client_id="key", uuid="header:event-id", created="timestamp")
SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="in", group_id="g", input_mapping=MAPPING)
GROUP = (GROUP_HEADER, b"g")


def restored(logs: dict[tuple[str, int], list[Any]], committed: int) -> Any:
    parsed = ParsedLogs()
    for span, messages in logs.items():
        parsed.add(SETTINGS, span, messages)  # type: ignore[arg-type]
    return fold_logs({0: committed}, parsed)[0]


def test_the_window_holds_header_uuids_at_record_times() -> None:
    inputs = [FakeMessage(o, b"user-7", b'{"op": "drain"}', [("event-id", f"e{o}".encode())], 1_000 + o)
              for o in range(3)]
    assert restored({("in", 0): inputs}, 2).seen == [("e0", 1.0), ("e1", 1.001)]


def test_a_dead_letter_past_the_commit_gives_its_uuid_and_the_records_time() -> None:
    kept = record_headers([("event-id", b"e-5")], 5_000)
    dead = FakeMessage(0, b"user-7", b'{"op": "nope"}',
                  [*kept, (DLQ_PARTITION, b"0"), (DLQ_OFFSET, b"5"), GROUP], 99_000)
    finished = restored({("in.dlq", 0): [dead]}, 4).finished_offsets[5]
    assert (finished.outcome, finished.uuid, finished.created_s) == (Outcome.DEAD_LETTERED, "e-5", 5.0)


def test_state_is_keyed_by_the_text_id() -> None:
    changelog = [FakeMessage(0, b"user-7", json_bytes(3), [(SOURCE_OFFSET_HEADER, b"1")], 0)]
    processed = FakeMessage(0, b"user-7", json_bytes({"clientId": "user-8", "uuid": "e4", "created": 1, "partition": 0,
                                                "offset": 4, "result": None}), [GROUP, (STATE_HEADER, b"9")], 0)
    state = restored({("g.state", 0): changelog, ("in.processed", 0): [processed]}, 2).state
    assert state == {"user-7": 3, "user-8": 9}
