"""The input mapping's one-call parse finds, for every mapping shape and every kind of record (good,
unusual or bad), exactly what the mapping's getters find: the same event, or the same dead-letter
reason and detail."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any

import orjson
import pytest

from keyrange.events import BadEvent, InputEvent
from keyrange.inputmapping import InputMapping

CLIENT_SOURCES = ("key", "header:client", "field:client", "field:who.client")
UUID_SOURCES = ("header:event-id", "field:uuid", "field:meta.uuid", "none")
CREATED_SOURCES = ("timestamp", "field:at", "field:meta.at")

MISSING = object()
"""A source value: the record has no such key, header or field."""
CLIENT_VALUES = ("user-7", "42", "042", 42, "ü-ñ", "", None, True, 1.5, b"\xff\xfe", "keyrange.totals",
                 "keyrange.totals.0/2", "keyrange.totalsX", MISSING)
UUID_VALUES = ("e-1", "", None, 5, b"\xff", MISSING)
CREATED_VALUES = (55, 0, None, "noon", MISSING)
HEADER_LAYOUTS = ("last", "first", "str", "dict")
"""How a record's headers are given: mapped headers last in a list, first (another header after
them), with str values, or as a dict."""
TIMESTAMPS = (1_700_000_000_123, 0)


def as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()


def build(sources: tuple[str, str, str], values: tuple[Any, Any, Any], layout: str
          ) -> tuple[bytes | None, bytes, Any]:
    """The key, value and headers of a record with `values` where `sources` say."""
    key: bytes | None = None
    body: dict[str, Any] = {"op": "increment", "amount": 2}
    headers: list[tuple[str, Any]] = []
    for source, value in zip(sources, values, strict=True):
        kind, _, name = source.partition(":")
        if value is MISSING or kind in ("timestamp", "none"):
            continue
        if kind == "key":
            key = as_bytes(value)
        elif kind == "header":
            raw = as_bytes(value)
            headers.append((name, raw.decode("latin-1") if layout == "str" and raw is not None else raw))
        else:
            *outer, last = name.split(".")
            place = body
            for part in outer:
                place = place.setdefault(part, {})
            place[last] = value.decode("latin-1") if isinstance(value, bytes) else value
    if layout == "first" and headers:
        headers.append(("other", b"x"))
    return key, orjson.dumps(body), dict(headers) if layout == "dict" else headers


def outcome(parse: Any, *record: Any) -> InputEvent | tuple[str, str]:
    try:
        found: InputEvent = parse(*record)
    except BadEvent as exc:
        return exc.reason, exc.detail
    return found


@pytest.mark.parametrize("sources", list(itertools.product(CLIENT_SOURCES, UUID_SOURCES, CREATED_SOURCES)))
def test_the_one_call_parse_finds_what_the_getters_find(sources: tuple[str, str, str]) -> None:
    parser = InputMapping(*sources).parser
    taken = 0
    for values in itertools.product(CLIENT_VALUES, UUID_VALUES, CREATED_VALUES):
        for layout, timestamp_ms in itertools.product(HEADER_LAYOUTS, TIMESTAMPS):
            key, value, headers = build(sources, values, layout)
            got = outcome(parser.parse, key, value, headers, timestamp_ms)
            assert got == outcome(parser.fields, key, orjson.loads(value), headers, timestamp_ms), (values, layout)
            taken += isinstance(got, InputEvent)
    assert taken  # some records of every shape are events, not only dead letters


def test_a_decoders_dict_subclass_is_read_as_the_getters_read_it() -> None:
    parser = InputMapping(client_id="field:client", format=f"{__name__}:decode_to_ordered").parser
    assert parser.parse(None, b"c-1,u-1", None, 5) == InputEvent("c-1", "u-1", 0, {"client": "c-1", "uuid": "u-1"})


def decode_to_ordered(value: bytes) -> dict[str, str]:
    """A user decoder whose dicts are a subclass of dict."""
    client, uuid = value.decode().split(",")
    return OrderedDict(client=client, uuid=uuid)
