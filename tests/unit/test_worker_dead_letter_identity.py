"""A dead letter too large for its topic keeps the event's identity under every input mapping: its
value becomes `{"clientId", "uuid", "created"}` of the event as the intake parsed it (a DLQ consumer
can name the event), and a restore reads the uuid and event time back from it, so the dedup window
is rebuilt exactly as with the default mapping (docs/design.md, "Dead letters")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from keyrange.events import DLQ_TRUNCATED, InputEvent, encode_input
from keyrange.inputmapping import InputMapping
from keyrange.kafkaio import KAFKA_DEFAULT_MAX_MESSAGE_BYTES
from keyrange.worker.commitwindow import Outcome
from keyrange.worker.outputs import Outputs
from keyrange.worker.restore import ParsedLogs, fold_logs
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.transactions import OutputRecord
from tests.fake_message import FakeMessage

RECORD_MS = 1_700_000_000_123
WRITTEN_MS = 1_700_000_099_000
"""When the dead letter was written: never the event's time."""
DLQ_LIMIT = 20_000
PAD = "x" * 50_000


def decode_csv(value: bytes) -> dict[str, Any]:
    """A user decoder for these tests: `account,id,pad`."""
    account, event_id, pad = value.decode().split(",")
    return {"account": account, "id": event_id, "pad": pad, "op": "increment", "amount": 1}


# (mapping, record key, record value, record headers) of one event of client "acct-7" (or 7), id "e-1".
CASES: dict[str, tuple[InputMapping, bytes | None, bytes, list[tuple[str, bytes]]]] = {
    "default": (InputMapping(), *encode_input(7, "e-1", RECORD_MS - 5, pad=PAD), []),
    "field-dotted": (InputMapping(client_id="field:who.account", uuid="field:meta.id", created="field:meta.at"),
                     b"k", orjson.dumps({"who": {"account": "acct-7"}, "meta": {"id": "e-1", "at": RECORD_MS - 5},
                                         "pad": PAD}), []),
    "key-field-uuid": (InputMapping(client_id="key", uuid="field:eventId", created="field:at"),
                       b"acct-7", orjson.dumps({"eventId": "e-1", "at": RECORD_MS - 5, "pad": PAD}), []),
    "key-header-timestamp": (InputMapping(client_id="key", uuid="header:event-id", created="timestamp"),
                             b"acct-7", orjson.dumps({"pad": PAD}), [("event-id", b"e-1")]),
    "header-client-no-uuid": (InputMapping(client_id="header:account", uuid="none", created="timestamp"),
                              b"k", orjson.dumps({"pad": PAD}), [("account", b"acct-7")]),
    "raw": (InputMapping(client_id="key", uuid="header:event-id", created="timestamp", format="raw"),
            b"acct-7", PAD.encode(), [("event-id", b"e-1")]),
    "decoder": (InputMapping(client_id="field:account", uuid="field:id", created="timestamp",
                             format=f"{__name__}:decode_csv"), b"k", f"acct-7,e-1,{PAD}".encode(), []),
}


def dead_letter_of(mapping: InputMapping, key: bytes | None, value: bytes,
                   headers: list[tuple[str, bytes]]) -> tuple[InputEvent, OutputRecord, WorkerSettings]:
    """The event the intake parses from the record, and the dead letter of its failing handler."""
    settings = WorkerSettings(bootstrap="x", topic="t", group_id="g", worker_id="w0", input_mapping=mapping)
    outputs = Outputs(settings, {settings.topic: 1, settings.sink: 1, settings.dlq: 1, settings.state: 1},
                      {settings.sink: KAFKA_DEFAULT_MAX_MESSAGE_BYTES, settings.state: KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
                       settings.dlq: DLQ_LIMIT})
    event = mapping.parser.parse(key, value, headers, RECORD_MS)
    # As the intake hands it on (intake.py): the fetched record under a mapping only.
    record = None if mapping.is_default else FakeMessage(5, key, value, headers, RECORD_MS)
    letter = outputs.dead_letter(0, 5, key, value, "handler-error", "boom", 4, event, record)
    assert letter is not None
    return event, letter, settings


@pytest.mark.parametrize("case", CASES)
def test_a_truncated_dead_letters_value_is_the_events_identity(case: str) -> None:
    event, letter, _ = dead_letter_of(*CASES[case])
    assert dict(letter.headers)[DLQ_TRUNCATED] == str(len(CASES[case][2])).encode()
    assert letter.value is not None, "the truncated dead letter names no event"
    identity = orjson.loads(letter.value)
    assert identity == {"clientId": event.client_id, "uuid": event.uuid, "created": event.created_ms}
    assert identity["clientId"] == (7 if case == "default" else "acct-7")
    assert identity["uuid"] == (None if case == "header-client-no-uuid" else "e-1")


@pytest.mark.parametrize("case", CASES)
def test_a_restore_reads_the_uuid_and_time_of_a_truncated_dead_letter(case: str) -> None:
    event, letter, settings = dead_letter_of(*CASES[case])
    parsed = ParsedLogs()
    # The dead letter as fetched: the dead-letter topic stamps it when it is written.
    parsed.add(settings, (settings.dlq, 0),
               [FakeMessage(0, letter.key, letter.value, list(letter.headers), WRITTEN_MS)])  # type: ignore[list-item]
    finished = fold_logs({0: 4}, parsed)[0].finished_offsets[5]
    assert (finished.outcome, finished.uuid, finished.created_s) == (
        Outcome.DEAD_LETTERED, event.uuid, event.created_ms / 1000)
