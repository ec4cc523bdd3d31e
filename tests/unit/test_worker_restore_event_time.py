"""An event without `created` joins the dedup window at its input record's timestamp (intake.py);
when it finished past the committed offset, the next owner puts it there too, not at the time its
output (processed record or dead letter) was written, which is later by the handler's time and its
retries. So the restored window, its clock and what it drops are the live owner's."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from keyrange.events import encode_processed
from keyrange.inputmapping import DEFAULT_MAPPING, InputMapping
from keyrange.kafkaio import KAFKA_DEFAULT_MAX_MESSAGE_BYTES
from keyrange.worker.attempts import Job
from keyrange.worker.intake import Intake
from keyrange.worker.outputs import Outputs
from keyrange.worker.restore import ParsedLogs, RestoredPartition, fold_logs
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.slot import SlotMetrics, SlotState
from keyrange.worker.transactions import OutputRecord
from tests.fake_message import FakeMessage

RECORD_MS = 1_700_000_000_000
"""The input record's timestamp: the event time of an event without `created`."""
WRITTEN_MS = RECORD_MS + 40_000
"""When its output was written (a slow handler and its retries): never the event's time."""
TTL_S = 10.0

# (mapping, key, value, headers) of one event without `created`, id "e-1".
RECORDS: dict[str, tuple[InputMapping, bytes, bytes, list[tuple[str, bytes]]]] = {
    "default": (DEFAULT_MAPPING, b"7", orjson.dumps({"clientId": 7, "uuid": "e-1", "op": "drain"}), []),
    "field mapping": (InputMapping(client_id="field:account", uuid="field:id"), b"acct-7",
                      orjson.dumps({"account": "acct-7", "id": "e-1", "op": "drain"}), []),
}


def slot_from(restored: RestoredPartition) -> SlotState:
    return SlotState(0, 0, restored, TTL_S, time.time, SlotMetrics("c", "w0", 0), None, 0)  # type: ignore[arg-type]


def finished_live(mapping: InputMapping, record: FakeMessage, outcome: str) -> tuple[SlotState, OutputRecord]:
    """The live owner: the intake admits the record, then its event is handled or dead-lettered;
    the output record the worker writes for it."""
    settings = WorkerSettings(bootstrap="x", topic="t", group_id="g", worker_id="w0", input_mapping=mapping)
    outputs = Outputs(settings, dict.fromkeys((settings.topic, settings.sink, settings.dlq, settings.state), 1),
                      dict.fromkeys((settings.sink, settings.state, settings.dlq), KAFKA_DEFAULT_MAX_MESSAGE_BYTES))
    slot = slot_from(RestoredPartition(0))
    job = Intake(1, 60.0, outputs, mapping=mapping).admit(slot, record, 0)  # type: ignore[arg-type]
    assert isinstance(job, Job)
    if outcome == "dead-lettered":
        letter = outputs.dead_letter(0, 0, job.key, job.value, "handler-error", "boom", 4, job.event, job.record)
    else:
        key, value = encode_processed(job.event, 0, 0, "w0", WRITTEN_MS - 5, WRITTEN_MS - 1, {"value": 0})
        letter = outputs.processed(0, key, value, None, False)
    assert letter is not None
    return slot, letter


def restored_slot(mapping: InputMapping, output: OutputRecord, record: FakeMessage) -> SlotState:
    """The next owner: restored from the output (fetched with the time it was written), then its
    fetch passes the finished record again."""
    settings = WorkerSettings(bootstrap="x", topic="t", group_id="g", worker_id="w1", input_mapping=mapping)
    parsed = ParsedLogs()
    fetched = FakeMessage(0, output.key, output.value, list(output.headers or []), WRITTEN_MS)
    parsed.add(settings, (output.topic, 0), [fetched])  # type: ignore[list-item]
    slot = slot_from(fold_logs({0: 0}, parsed)[0])
    value = record.value()
    assert not slot.admit(0, record.timestamp()[1], len(value or b""))  # finished by the live owner
    return slot


@pytest.mark.parametrize("outcome", ["dead-lettered", "handled"])
@pytest.mark.parametrize("case", RECORDS)
def test_the_restored_window_holds_the_event_at_its_records_time(case: str, outcome: str) -> None:
    mapping, key, value, headers = RECORDS[case]
    record = FakeMessage(0, key, value, headers, RECORD_MS)
    live, output = finished_live(mapping, record, outcome)
    restored = restored_slot(mapping, output, record)
    assert live.stream_time == RECORD_MS / 1000
    assert restored.stream_time == live.stream_time
    # The uuid re-sent 15 s later (past the TTL): new to the live window, so new to the restored one.
    later: Any = (RECORD_MS + 15_000) / 1000
    assert live.first_seen(1, "e-1", later)
    assert restored.first_seen(1, "e-1", later)
