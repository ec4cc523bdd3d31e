"""Outputs: an event whose outputs Kafka would refuse is found before its transaction
(`too_large`), and a dead letter over its topic's limit is truncated rather than failing every
transaction of its slot (`dead_letter`)."""

from __future__ import annotations

import itertools

import pytest

from keyrange.events import (
    DLQ_ATTEMPTS,
    DLQ_DETAIL,
    DLQ_OFFSET,
    DLQ_REASON,
    DLQ_TRUNCATED,
    GROUP_HEADER,
    MAX_EVENT_BYTES,
    STATE_HEADER,
    InputEvent,
    encode_input,
    parse_input,
)
from keyrange.kafkaio import KAFKA_DEFAULT_MAX_MESSAGE_BYTES
from keyrange.worker.outputs import RECORD_OVERHEAD_BYTES, Outputs
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.transactions import OutputRecord
from tests.slotstate import Staged, held_slot, take_staged

SETTINGS = WorkerSettings(bootstrap="x", topic="t", group_id="g")
LIMITS = {SETTINGS.sink: 2_000, SETTINGS.state: 1_200, SETTINGS.dlq: 2_000}


def refused(key: int, value: int, state: int | None) -> bool:
    """The rule written out: the processed record (key, value, group and state headers) against the
    sink's limit, the state record (key and state) against the changelog's."""
    group = len(GROUP_HEADER) + len(SETTINGS.group_id)
    with_state = 0 if state is None else len(STATE_HEADER) + state
    processed = key + value + group + with_state + RECORD_OVERHEAD_BYTES
    changelog = state is not None and key + state + RECORD_OVERHEAD_BYTES > LIMITS[SETTINGS.state]
    return processed > LIMITS[SETTINGS.sink] or changelog


@pytest.mark.parametrize("limits", [LIMITS, {}], ids=["limits-known", "no-limits"])
def test_too_large_refuses_exactly_what_either_topic_would(limits: dict[str, int]) -> None:
    stage = Outputs(SETTINGS, {SETTINGS.topic: 4, SETTINGS.sink: 4, SETTINGS.dlq: 4, SETTINGS.state: 4}, limits)
    sizes = range(0, 2_100, 37)
    for key, value, state in itertools.product((4, 40), sizes, [None, *sizes]):
        why = stage.too_large(b"k" * key, b"v" * value, None if state is None else b"s" * state)
        expected = bool(limits) and refused(key, value, state)
        assert (why is not None) == expected, (key, value, state, why)


# --- dead letters ---------------------------------------------------------------------------------

DLQ_SETTINGS = WorkerSettings(bootstrap="x", topic="t", group_id="g", worker_id="w0")


def dlq_stage(dlq_limit: int) -> Outputs:
    s = DLQ_SETTINGS
    return Outputs(s, {s.topic: 1, s.sink: 1, s.dlq: 1, s.state: 1},
                   {s.sink: KAFKA_DEFAULT_MAX_MESSAGE_BYTES, s.state: KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
                    s.dlq: dlq_limit})


def record_bytes(r: OutputRecord) -> int:
    return len(r.key or b"") + len(r.value or b"") + sum(len(n) + len(v) for n, v in r.headers) + RECORD_OVERHEAD_BYTES


def dead_lettered(outputs: Outputs, offset: int, *args: object) -> Staged:
    """What a slot stages for the event at `offset` dead-lettered through `outputs.dead_letter`."""
    slot = held_slot()
    assert slot.admit(offset, 0, 0)
    reason = str(args[2])
    slot.finish_dead_lettered(offset, outputs.dead_letter(slot.partition, offset, *args), reason)  # type: ignore[arg-type]
    staged = take_staged(slot)
    assert staged is not None
    return staged


def event_of(size: int) -> tuple[bytes, bytes, InputEvent]:
    key, value = encode_input(7, "u-7", 1_700_000_000_000, pad="x" * size)
    return key, value, parse_input(value)


def test_a_dead_letter_of_an_event_at_the_input_limit_fits_a_dlq_with_kafkas_default_limit_whole() -> None:
    key, value, event = event_of(MAX_EVENT_BYTES - 100)
    value = value[:-1] + b" " * (MAX_EVENT_BYTES - len(value)) + b"}"
    assert len(value) == MAX_EVENT_BYTES and parse_input(value).uuid == "u-7"
    staged = dead_lettered(dlq_stage(KAFKA_DEFAULT_MAX_MESSAGE_BYTES), 5, key, value, "handler-error", "E" * 5_000, 4,
                           event)
    (record,) = staged.outputs
    assert (record.key, record.value) == (key, value)
    assert DLQ_TRUNCATED not in dict(record.headers) and staged.dead_letters == ["handler-error"]


def test_a_dead_letter_over_the_dlq_limit_keeps_the_events_identity_and_says_how_large_it_was() -> None:
    key, value, event = event_of(50_000)
    staged = dead_lettered(dlq_stage(20_000), 5, key, value, "handler-error", "boom", 4, event)
    (record,) = staged.outputs
    headers = dict(record.headers)
    assert headers[DLQ_TRUNCATED] == str(len(value)).encode()
    assert (headers[DLQ_REASON], headers[DLQ_DETAIL], headers[DLQ_OFFSET], headers[DLQ_ATTEMPTS]) == (
        b"handler-error", b"boom", b"5", b"4")
    assert headers[GROUP_HEADER] == b"g" and record.key == key
    # What a restore reads back from it: the same event identity, so the dedup window is rebuilt exactly.
    assert parse_input(record.value)[:3] == event[:3]
    assert record_bytes(record) <= 20_000 and staged.dead_letters == ["handler-error"]


def test_bad_input_over_the_producers_own_limit_is_dead_lettered_without_its_value() -> None:
    """An input topic may allow records over the input limit, larger than the producer sends even
    where the DLQ allows them: the oversized dead letter must fit both."""
    value = b"{" + b" " * (3 * MAX_EVENT_BYTES) + b"}"
    staged = dead_lettered(dlq_stage(10 * MAX_EVENT_BYTES), 9, b"7", value, "oversized", "too big", 0)
    (record,) = staged.outputs
    assert record.value is None and record.key == b"7"
    assert dict(record.headers)[DLQ_TRUNCATED] == str(len(value)).encode()


@pytest.mark.parametrize("limit", [600, 700, 800, 1_000, 1_200, 3_000])
def test_every_dead_letter_staged_fits_its_topic_down_to_its_headers_alone(limit: int) -> None:
    for size in (0, 100, 1_000, 10_000):
        key, value, event = event_of(size)
        for key_size in (1, 400):
            staged = dead_lettered(dlq_stage(limit), 5, key * key_size, value, "handler-error", "boom", 1, event)
            assert staged.dead_letters == ["handler-error"]  # counted, written or not
            assert all(record_bytes(r) <= limit for r in staged.outputs), (limit, size, key_size)


def test_a_batch_of_records_that_fit_one_by_one_fits_every_output_topic_too() -> None:
    assert dlq_stage(KAFKA_DEFAULT_MAX_MESSAGE_BYTES).batch_bytes is None  # librdkafka's default batch fits
    assert dlq_stage(100_000).batch_bytes == 100_000 - RECORD_OVERHEAD_BYTES
    assert dlq_stage(100).batch_bytes == 1  # one record per batch
