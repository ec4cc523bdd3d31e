"""A mapping's text clientIds are decoded once per client, not once per record: the parse hands
every record of a client the same str (whose hash is then computed once), keeps at most
KNOWN_CLIENTS of them, and never keeps one it would refuse (binary, reserved, empty)."""

from __future__ import annotations

import pytest

from keyrange.events import BadEvent, InputEvent, encode_processed
from keyrange.inputmapping import KNOWN_CLIENT_BYTES, KNOWN_CLIENTS, InputMapping

KEYED = InputMapping(client_id="key", uuid="header:event-id", created="timestamp")
HEADED = InputMapping(client_id="header:account", uuid="header:event-id", created="timestamp")


def parse(mapping: InputMapping, client: bytes, uuid: str = "e-1") -> InputEvent:
    """The event of a record of `client` (in the key or the `account` header) under `mapping`."""
    headers = [("account", client), ("event-id", uuid.encode())]
    return mapping.parser.parse(bytes(client), b'{"op": "increment", "amount": 1}', headers, 5)


@pytest.mark.parametrize("mapping", [KEYED, HEADED], ids=["key", "header"])
def test_every_record_of_a_client_gets_one_str(mapping: InputMapping) -> None:
    first, second = parse(mapping, b"user-7", "e-1"), parse(mapping, b"user-7", "e-2")
    assert first.client_id == "user-7" and second.client_id is first.client_id
    assert parse(mapping, b"user-8").client_id == "user-8"


@pytest.mark.parametrize("refused", [b"\xff\xfe", b"keyrange.totals", b"keyrange.totals.0/2", b""])
def test_a_refused_id_is_refused_every_time(refused: bytes) -> None:
    parser = InputMapping(client_id="key", uuid="header:event-id", created="timestamp").parser
    for _ in range(3):
        with pytest.raises(BadEvent):
            parser.parse(refused, b"{}", [("event-id", b"e-1")], 5)


def test_past_the_limit_ids_are_still_found() -> None:
    parser = InputMapping(client_id="key", uuid="none", created="timestamp").parser
    for i in range(KNOWN_CLIENTS + 10):
        assert parser.parse(b"c-%d" % i, b"{}", None, 5).client_id == f"c-{i}"
    assert parser.parse(b"c-0", b"{}", None, 5).client_id == "c-0"
    long_key = b"x" * (KNOWN_CLIENT_BYTES + 1)
    assert parser.parse(long_key, b"{}", None, 5).client_id == long_key.decode()


def test_a_processed_records_key_may_come_encoded() -> None:
    event = InputEvent("user-7", "u-7", 100, {})
    assert encode_processed(event, 3, 42, "w-1", 105, 116, None, b"user-7") == encode_processed(
        event, 3, 42, "w-1", 105, 116, None)
