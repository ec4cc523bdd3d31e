"""The input mapping (`spec.input`): every mapping, what each finds, and the dead-letter reason and
path each failure gets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest

from keyrange.commands.worker import add_arguments, plan
from keyrange.errors import UserError
from keyrange.events import BadEvent, InputEvent, encode_input, parse_input
from keyrange.inputmapping import DEFAULT_MAPPING, InputMapping, record_headers, source_timestamp
from keyrange.ranges.slots import partition_for_client, partition_for_key
from keyrange.spec import SpecError, parse_spec

VALUE = b'{"op": "increment", "amount": 2}'
TS = 1_700_000_000_123


def parse(mapping: InputMapping, key: bytes | None = b"user-7", value: bytes | None = VALUE,
          headers: Any = None, timestamp_ms: int = TS) -> InputEvent:
    return mapping.parser.parse(key, value, headers, timestamp_ms)


def failure(mapping: InputMapping, **record: Any) -> tuple[str, str]:
    with pytest.raises(BadEvent) as info:
        parse(mapping, **record)
    return info.value.reason, info.value.detail


TOPIC_MAPPING = InputMapping(client_id="key", uuid="header:event-id", created="timestamp")


def test_the_default_mapping_is_the_wire_contract() -> None:
    _, value = encode_input(1042, "u-1", 1_700_000_000_000, op="increment", amount=5)
    assert DEFAULT_MAPPING.is_default and DEFAULT_MAPPING.dedup
    assert parse(DEFAULT_MAPPING, key=b"1042", value=value) == parse_input(value)
    # A string clientId stays bad input under the default mapping, as it always was.
    assert failure(DEFAULT_MAPPING, value=b'{"clientId": "x", "uuid": "u"}')[0] == "bad-field"


def test_key_header_and_timestamp() -> None:
    event = parse(TOPIC_MAPPING, headers=[("event-id", b"e-1"), ("other", b"x")])
    assert event == InputEvent("user-7", "e-1", TS, {"op": "increment", "amount": 2})


def test_no_headers_at_all_is_a_missing_header() -> None:
    for headers in ([], None, {}):
        assert failure(TOPIC_MAPPING, headers=headers) == (
            "missing-field", "uuid (header:event-id): record has no header 'event-id'")


def test_the_last_of_repeated_headers_wins() -> None:
    assert parse(TOPIC_MAPPING, headers=[("event-id", b"old"), ("event-id", b"new")]).uuid == "new"


def test_nested_fields() -> None:
    mapping = InputMapping(client_id="field:user.id", uuid="field:meta.id", created="field:meta.at")
    value = orjson.dumps({"user": {"id": "u-9"}, "meta": {"id": "m-1", "at": 55}})
    assert parse(mapping, value=value)[:3] == ("u-9", "m-1", 55)


def test_a_field_clientid_is_an_integer_or_text_and_a_decimal_string_is_that_integer() -> None:
    mapping = InputMapping(client_id="field:user")
    assert parse(mapping, value=b'{"user": 42, "uuid": "a"}').client_id == 42
    assert parse(mapping, value=b'{"user": "42", "uuid": "a"}').client_id == 42
    assert parse(mapping, value=b'{"user": "042", "uuid": "a"}').client_id == "042"
    assert parse(mapping, value=b'{"user": "u-42", "uuid": "a"}').client_id == "u-42"
    # The changelog and sink key of each (str(clientId)) restores to the same id.
    for client in (42, "042", "u-42"):
        assert mapping.client_of_key(str(client).encode()) == client
    assert TOPIC_MAPPING.client_of_key(b"42") == "42"


def test_missing_created_falls_back_to_the_record_timestamp_as_by_default() -> None:
    mapping = InputMapping(client_id="key")
    assert parse(mapping, value=b'{"uuid": "a"}').created_ms == 0  # the intake then takes the timestamp


def test_uuid_none_turns_dedup_off() -> None:
    mapping = InputMapping(client_id="key", uuid="none", created="timestamp")
    assert not mapping.dedup
    assert parse(mapping).uuid is None


@pytest.mark.parametrize(
    ("mapping", "record", "reason", "path"),
    [
        (TOPIC_MAPPING, {"key": None, "headers": [("event-id", b"e")]}, "missing-field", "clientId (key)"),
        (TOPIC_MAPPING, {"key": b"", "headers": [("event-id", b"e")]}, "bad-field", "clientId (key) is empty"),
        (TOPIC_MAPPING, {"key": b"\xff\xfe\x00", "headers": [("event-id", b"e")]}, "bad-field",
         "clientId (key) is not UTF-8 text"),
        (TOPIC_MAPPING, {"headers": None}, "missing-field", "uuid (header:event-id): record has no header"),
        (TOPIC_MAPPING, {"headers": [("event-id", b"")]}, "bad-field", "uuid (header:event-id) is empty"),
        (TOPIC_MAPPING, {"headers": [("event-id", None)]}, "bad-field", "uuid (header:event-id) is empty"),
        (TOPIC_MAPPING, {"key": b"keyrange.totals", "headers": [("event-id", b"e")]}, "bad-field", "reserved"),
        (TOPIC_MAPPING, {"key": b"keyrange.totals.0/2", "headers": [("event-id", b"e")]}, "bad-field", "reserved"),
        (InputMapping(client_id="field:user.id"), {"value": b'{"user": {}, "uuid": "a"}'}, "missing-field",
         "clientId (field:user.id): value has no 'user.id'"),
        (InputMapping(client_id="field:user.id"), {"value": b'{"user": 7, "uuid": "a"}'}, "missing-field",
         "value has no 'user.id'"),
        (InputMapping(client_id="field:user"), {"value": b'{"user": 1.5, "uuid": "a"}'}, "bad-field",
         "clientId (field:user) must be an integer or non-empty text"),
        (InputMapping(client_id="field:user"), {"value": b'{"user": true, "uuid": "a"}'}, "bad-field",
         "clientId (field:user)"),
        (InputMapping(client_id="field:user"), {"value": b'{"user": "", "uuid": "a"}'}, "bad-field",
         "clientId (field:user)"),
        (InputMapping(client_id="key", uuid="field:id"), {"value": b'{"id": 5}'}, "bad-field",
         "uuid (field:id) must be non-empty text"),
        (InputMapping(client_id="key", created="field:at"), {"value": b'{"uuid": "a", "at": "noon"}'}, "bad-field",
         "created (field:at) must be epoch milliseconds"),
        (TOPIC_MAPPING, {"value": None}, "missing-field", "record has no value"),
        (TOPIC_MAPPING, {"value": b"not json"}, "not-json", ""),
        (TOPIC_MAPPING, {"value": b"[1]"}, "not-an-object", ""),
        (TOPIC_MAPPING, {"value": b"{" + b" " * 1_000_000 + b"}"}, "oversized", ""),
    ],
)
def test_each_failure_names_its_mapping(mapping: InputMapping, record: dict[str, Any], reason: str,
                                        path: str) -> None:
    got_reason, detail = failure(mapping, **record)
    assert (got_reason, path in detail) == (reason, True), detail


def test_raw_hands_the_bytes_to_the_handler() -> None:
    mapping = InputMapping(client_id="key", uuid="header:id", created="timestamp", format="raw")
    event = parse(mapping, value=b"\x00\x01binary", headers=[("id", b"x")])
    assert event.body == b"\x00\x01binary"


def decode_csv(value: bytes) -> dict[str, Any]:
    """A user decoder for the tests: `client,uuid,amount`."""
    client, uuid, amount = value.decode().split(",")
    return {"client": client, "uuid": uuid, "op": "increment", "amount": int(amount)}


def decode_to_list(value: bytes) -> list[int]:
    """A user decoder that breaks its contract."""
    return [1]


def test_a_user_decoder_feeds_the_fields() -> None:
    mapping = InputMapping(client_id="field:client", format=f"{__name__}:decode_csv")
    event = parse(mapping, value=b"acme,u-1,3")
    assert event[:2] == ("acme", "u-1") and event.body["amount"] == 3
    assert failure(mapping, value=b"no commas")[0] == "decode-error"
    assert failure(InputMapping(client_id="key", format=f"{__name__}:decode_to_list"))[0] == "not-an-object"


def test_a_missing_decoder_is_a_user_error() -> None:
    with pytest.raises(UserError, match="cannot import module 'no_such_module'"):
        InputMapping(format="no_such_module:decode").parser  # noqa: B018
    with pytest.raises(UserError, match="has no function 'nope'"):
        InputMapping(format=f"{__name__}:nope").parser  # noqa: B018


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ({"clientId": "value"}, "spec.input.clientId"),
        ({"clientId": "field:"}, "spec.input.clientId"),
        ({"clientId": "field:a..b"}, "spec.input.clientId"),
        ({"uuid": "key"}, "spec.input.uuid"),
        ({"created": "header:t"}, "spec.input.created"),
        ({"format": "avro"}, "spec.input.format"),
        ({"format": "raw"}, "input.format raw hands the value's bytes to the handler and has no fields"),
    ],
)
def test_bad_mappings_name_the_field(given: dict[str, str], fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kafka": {"topic": "events"}, "input": given}, "payments")
    assert fragment in str(info.value)


def test_the_spec_and_the_worker_flags_give_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: keyrange.dev/v1alpha1\nkind: StreamConsumer\nmetadata: {name: c}\n"
                    "spec:\n  kafka: {bootstrapServers: 'k:9092', topic: events}\n"
                    "  input: {clientId: key, uuid: 'header:event-id', created: timestamp}\n", encoding="utf-8")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    from_spec = plan(parser.parse_args(["--spec-file", str(path), "--partitions", "0"])).settings
    assert from_spec.input_mapping == TOPIC_MAPPING
    flagged = plan(parser.parse_args(["--spec-file", str(path), "--partitions", "0", "--input-uuid", "none"]))
    assert flagged.settings.input_mapping == InputMapping(client_id="key", uuid="none", created="timestamp")
    with pytest.raises(UserError, match=r"input\.uuid is 'key'"):
        plan(parser.parse_args(["--spec-file", str(path), "--partitions", "0", "--input-uuid", "key"]))


def test_a_dead_letter_keeps_the_records_headers_and_timestamp() -> None:
    kept = record_headers([("event-id", b"e-1"), ("empty", None)], TS)
    assert kept[:2] == [("event-id", b"e-1"), ("empty", b"")]
    dead_letter = dict(kept)
    assert source_timestamp(dead_letter, 5) == TS
    assert source_timestamp({}, 5) == 5
    # Parsed back under the mapping, it gives the event the intake saw.
    assert parse(TOPIC_MAPPING, headers=kept, timestamp_ms=source_timestamp(dead_letter, 5)).uuid == "e-1"


@pytest.mark.parametrize("client", ["user-7f3a9c", "ü-ñ", "1042"])
def test_placement_hashes_the_key_bytes(client: str) -> None:
    assert partition_for_client(client, 12) == partition_for_key(client.encode(), 12)
    assert partition_for_client(1042, 12) == partition_for_key(b"1042", 12)
