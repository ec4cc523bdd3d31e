"""Wire formats: what a valid input is, and the reason code for each kind of bad input."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import orjson
import pytest

from keyrange.events import (
    MAX_EVENT_BYTES,
    BadEvent,
    InputEvent,
    dead_letter_headers,
    decode_processed,
    encode_input,
    encode_processed,
    json_bytes,
    parse_input,
)


def test_input_round_trip() -> None:
    key, value = encode_input(1042, "u-1", 1_700_000_000_000, op="increment", amount=5)
    assert key == b"1042"
    event = parse_input(value)
    assert event == InputEvent(1042, "u-1", 1_700_000_000_000, orjson.loads(value))
    assert event.body["amount"] == 5


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "missing-field"),
        (b"not json", "not-json"),
        (b"[1, 2]", "not-an-object"),
        (b'{"uuid": "a"}', "missing-field"),
        (b'{"clientId": 1}', "missing-field"),
        (b'{"clientId": "1", "uuid": "a"}', "bad-field"),
        (b'{"clientId": true, "uuid": "a"}', "bad-field"),
        (b'{"clientId": 1, "uuid": ""}', "bad-field"),
        (b'{"clientId": 1, "uuid": "a", "created": "yesterday"}', "bad-field"),
        (b"{" + b" " * MAX_EVENT_BYTES + b"}", "oversized"),
    ],
)
def test_bad_input_has_a_reason(value: bytes | None, reason: str) -> None:
    with pytest.raises(BadEvent) as info:
        parse_input(value)
    assert info.value.reason == reason


def test_processed_record_has_the_contract_fields() -> None:
    event = InputEvent(7, "u-7", 100, {})
    key, value = encode_processed(event, 3, 42, "w-1", 105, 116, {"value": 1, "returned": 1})
    assert key == b"7"
    assert decode_processed(value) == {
        "clientId": 7, "uuid": "u-7", "created": 100, "partition": 3, "offset": 42, "worker": "w-1",
        "startedAt": 105, "finishedAt": 116, "result": {"value": 1, "returned": 1},
    }


def test_dead_letter_headers_say_why_and_where() -> None:
    headers = dict(dead_letter_headers("not-json", "x" * 5000, "events", 2, 9, 1))
    assert headers["keyrange.reason"] == b"not-json"
    assert len(headers["keyrange.detail"]) == 2000
    assert headers["keyrange.source.partition"] == b"2"
    assert headers["keyrange.source.offset"] == b"9"


def _bytes_held(make: Callable[[int], bytes], count: int = 1000) -> tuple[int, int]:
    """Memory held by `count` results of `make` (tracemalloc), and their total length."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        values = [make(i) for i in range(count)]
        return tracemalloc.get_traced_memory()[0] - before, sum(len(v) for v in values)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("make", [
    pytest.param(lambda i: encode_processed(InputEvent(i, f"u-{i}", 100, {}), 3, i, "w-1", 105, 116,
                                            {"balance": i})[1], id="processed"),
    pytest.param(lambda i: encode_input(i, f"u-{i}", 100, op="deposit", amount=i)[1], id="input"),
    pytest.param(lambda i: json_bytes({"balance": i}), id="state"),
])
def test_an_encoded_record_holds_about_its_own_size(make: Callable[[int], bytes]) -> None:
    # A worker holds two of these per event in flight and one state per client; orjson's own
    # bytes hold 4 KiB each, whatever their length (a 200,000-event backlog grew a worker to 620 MiB).
    held, length = _bytes_held(make)
    assert held < length + 100 * 1000, f"{held} bytes held for {length} bytes of records"
