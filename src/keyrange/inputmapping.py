"""The input mapping (`spec.input`): where a record's clientId, uuid and event time are, and how
its value is decoded, so keyrange consumes topics it did not produce (docs/input.md).

    clientId: key | field:<name> | header:<name>        (default field:clientId)
    uuid:     field:<name> | header:<name> | none       (default field:uuid)
    created:  field:<name> | timestamp                  (default field:created)
    format:   json | raw | module:function              (default json)

The default mapping is the wire contract of events.py (an integer clientId), parsed by
`parse_input` itself: the worker's hot path does not change for it. Any other mapping goes through
`InputParser.parse`. A clientId is an integer (found as a JSON integer in a field) or non-empty
UTF-8 text; a string field that spells an integer is that integer, so `"42"` and `42` are one
client, exactly as their record keys are one. A binary (non-UTF-8) key or header is not a
clientId: the record is dead-lettered as `bad-field`. Field names may be dotted for nested fields.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Protocol

import orjson

from keyrange.errors import UserError
from keyrange.events import (
    DLQ_SOURCE_TIMESTAMP,
    MAX_EVENT_BYTES,
    TOTALS_KEY,
    BadEvent,
    ClientId,
    InputEvent,
    parse_input,
)

DEFAULT_CLIENT_ID = "field:clientId"
DEFAULT_UUID = "field:uuid"
DEFAULT_CREATED = "field:created"
DEFAULT_FORMAT = "json"

_FIELD = r"field:[^.\s]+(\.[^.\s]+)*"
CLIENT_ID_PATTERN = rf"^(key|{_FIELD}|header:\S+)$"
UUID_PATTERN = rf"^(none|{_FIELD}|header:\S+)$"
CREATED_PATTERN = rf"^(timestamp|{_FIELD})$"
FORMAT_PATTERN = r"^(json|raw|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"
"""The syntax of each mapping; the CRD carries the same patterns."""

KNOWN_CLIENTS = 65_536
"""The most text clientIds a parser keeps decoded, each of at most KNOWN_CLIENT_BYTES (about 17 MB in
all), emptied when full: a worker meets its clients again and again, and one str per client costs
less per record than a new one per record."""
KNOWN_CLIENT_BYTES = 64
_CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]{0,18})")
_RESERVED_ID = TOTALS_KEY.decode()

Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None
"""A record's headers as confluent_kafka gives them (a list of pairs in practice)."""
Decoder = Callable[[bytes], Any]


class SourceRecord(Protocol):
    """What a dead letter keeps of its input record under a mapping (a confluent_kafka Message):
    asked only when one is written, so a record's headers are read per record only by a mapping
    that reads a header."""

    def headers(self) -> Headers:
        """The record's headers."""

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, epoch ms)."""


@dataclass(frozen=True, slots=True)
class Source:
    """One parsed mapping: where a value is found."""

    kind: Literal["key", "field", "header", "timestamp", "none"]
    name: str = ""
    """The field (dotted) or header name."""

    @property
    def path(self) -> tuple[str, ...]:
        """A field's path of nested names."""
        return tuple(self.name.split("."))

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


def parse_source(text: str, pattern: str, what: str) -> Source:
    """Parse one mapping (`key`, `field:a.b`, `header:x`, `timestamp`, `none`); ValueError names the fix."""
    if not re.match(pattern, text):
        allowed = {"clientId": "key | field:<name> | header:<name>", "uuid": "field:<name> | header:<name> | none",
                   "created": "field:<name> | timestamp"}[what]
        raise ValueError(f"input.{what} is {text!r}; expected {allowed}")
    kind, _, name = text.partition(":")
    return Source(kind, name)  # type: ignore[arg-type]


@dataclass(frozen=True)
class InputMapping:
    """`spec.input` as plain values, checked (module docstring)."""

    client_id: str = DEFAULT_CLIENT_ID
    """Where the clientId is."""
    uuid: str = DEFAULT_UUID
    """Where the event id is; `none` turns deduplication off."""
    created: str = DEFAULT_CREATED
    """Where the event time (epoch ms) is; `timestamp` is the record's."""
    format: str = DEFAULT_FORMAT
    """How the value is decoded for the handler and for `field:` mappings."""

    def __post_init__(self) -> None:
        sources = self.sources()
        if not re.match(FORMAT_PATTERN, self.format):
            raise ValueError(f"input.format is {self.format!r}; expected json | raw | module:function")
        if self.format == "raw":
            fields = [f"input.{what}: {source}" for what, source in zip(("clientId", "uuid", "created"), sources,
                                                                         strict=True) if source.kind == "field"]
            if fields:
                raise ValueError(f"input.format raw hands the value's bytes to the handler and has no fields, "
                                 f"but {', '.join(fields)}; use key, header:<name>, timestamp or none")

    def sources(self) -> tuple[Source, Source, Source]:
        """The clientId, uuid and created mappings, parsed."""
        return (parse_source(self.client_id, CLIENT_ID_PATTERN, "clientId"),
                parse_source(self.uuid, UUID_PATTERN, "uuid"),
                parse_source(self.created, CREATED_PATTERN, "created"))

    @property
    def is_default(self) -> bool:
        """The wire contract of events.py, parsed by `parse_input` (the hot path)."""
        return self == DEFAULT_MAPPING

    @property
    def dedup(self) -> bool:
        """False with `uuid: none`: nothing is deduplicated."""
        return self.uuid != "none"

    @property
    def reads_headers(self) -> bool:
        """Some mapping reads a record header (dead letters then carry the record's headers)."""
        return any(s.kind == "header" for s in self.sources())

    @property
    def integer_ids(self) -> bool:
        """Client ids may be integers (a `field:` clientId); else they are always text."""
        return self.client_id.startswith("field:")

    def client_of_key(self, key: bytes) -> ClientId:
        """The clientId a record key (of a changelog or sink record, str(clientId) as UTF-8) stands for."""
        text = key.decode()
        if self.integer_ids and _CANONICAL_INT.fullmatch(text):
            return int(text)
        return text

    @cached_property
    def parser(self) -> InputParser:
        """The parser of this mapping, its decoder loaded once (UserError when it cannot be)."""
        decoder = None if self.format in ("json", "raw") else load_decoder(self.format)
        return InputParser(self, decoder)


DEFAULT_MAPPING = InputMapping()


def record_headers(headers: Headers, timestamp_ms: int) -> list[tuple[str, bytes]]:
    """What a dead letter keeps of its record besides key and value, under a mapping other than the
    default: the record's headers and its timestamp (a dead letter's own timestamp is when it was
    written), so a restore finds the event's uuid and time in it as the intake did."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    kept = [(name, _as_bytes(value)) for name, value in pairs]
    kept.append((DLQ_SOURCE_TIMESTAMP, str(timestamp_ms).encode()))
    return kept


def kept_headers(record: SourceRecord) -> list[tuple[str, bytes]]:
    """`record_headers` of a fetched record."""
    return record_headers(record.headers(), record.timestamp()[1])


def source_timestamp(dead_letter_headers: Mapping[str, str | bytes | None], written_ms: int) -> int:
    """The timestamp of a dead letter's record: the kept one (`record_headers`), else the dead letter's."""
    kept = dead_letter_headers.get(DLQ_SOURCE_TIMESTAMP)
    try:
        return int(kept) if kept else written_ms
    except ValueError:
        return written_ms


def load_decoder(ref: str) -> Decoder:
    """The user decoder `module:function` (bytes -> dict); UserError naming the fix when missing."""
    module_name, _, function_name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"input.format {ref!r}: cannot import module {module_name!r} ({exc}); "
                        "install it or put it on PYTHONPATH") from None
    decoder = getattr(module, function_name, None)
    if not callable(decoder):
        raise UserError(f"input.format {ref!r}: module {module_name!r} has no function {function_name!r}")
    return decoder  # type: ignore[no-any-return]


ParseFunction = Callable[[bytes | None, bytes | None, Headers, int], InputEvent]
"""(key, value, headers, record timestamp in epoch ms) -> the record's event; raises BadEvent."""
FieldsFunction = Callable[[bytes | None, Any, Headers, int], InputEvent]
"""(key, decoded value, headers, record timestamp in epoch ms) -> the record's event; raises BadEvent."""


class InputParser:
    """Parses records under one mapping into InputEvents; raises BadEvent naming the failed mapping.

    `parse` is one function built for the mapping's shape once, here: a record costs one call, not a
    call per mapping (the ledger benchmark compares this path with the default's). It takes the
    common record at once; anything else (a missing or unusual key, header or field) it hands to the
    mapping's getters, which find the same event or raise the BadEvent that names the failure."""

    __slots__ = ("fields", "mapping", "parse", "reads_headers")

    parse: ParseFunction
    """The event of one record (key, value, headers, record timestamp in epoch ms).

    Reason codes: those of `parse_input`, and `decode-error` when a user decoder raises."""
    fields: FieldsFunction
    """The event of a record whose value is decoded (key, decoded value, headers, record timestamp)
    by the mapping's getters alone: under any mapping but the default (whose `parse` is
    `parse_input`), what `parse` finds, in every case, more slowly."""

    def __init__(self, mapping: InputMapping, decoder: Decoder | None) -> None:
        self.mapping = mapping
        self.reads_headers = mapping.reads_headers
        """Whether `parse` needs the record's headers (None may be passed otherwise)."""
        self.fields = _exact_fields(*mapping.sources())
        self.parse = parse_input_record if mapping.is_default else _shaped_parse(mapping, decoder, self.fields)


def parse_input_record(key: bytes | None, value: bytes | None, headers: Headers, timestamp_ms: int) -> InputEvent:
    """`parse_input` with a mapping's signature: the default mapping reads only the value."""
    return parse_input(value)


def _value_decoder(mapping: InputMapping, decoder: Decoder | None) -> Callable[[bytes], Any]:
    """The value under `raw` or a user decoder (the shaped parse decodes JSON itself)."""
    if decoder is None:
        return lambda value: value
    ref = mapping.format

    def decode(value: bytes) -> Any:
        try:
            body = decoder(value)
        except Exception as exc:  # noqa: BLE001 - any decoder failure is this record's problem
            raise BadEvent("decode-error", f"{ref}: {type(exc).__name__}: {exc}") from None
        if not isinstance(body, dict):
            raise BadEvent("not-an-object", f"{ref} returned a {type(body).__name__}, expected an object (a dict)")
        return body
    return decode


def _exact_fields(client: Source, uuid: Source, created: Source) -> FieldsFunction:
    """The event of a decoded record by the mapping's getters: every case, every BadEvent."""
    get_client = _client_getter(client)
    get_uuid = None if uuid.kind == "none" else _text_getter(uuid, "uuid")

    def fields(key: bytes | None, body: Any, headers: Headers, timestamp_ms: int) -> InputEvent:
        client_id = get_client(key, body, headers)
        event_id = None if get_uuid is None else get_uuid(key, body, headers)
        if created.kind == "timestamp":
            return InputEvent(client_id, event_id, timestamp_ms if timestamp_ms > 0 else 0, body)
        found = _find(body, created, "created", required=False)
        if found is None:
            found = 0
        elif type(found) is not int:
            raise BadEvent("bad-field", f"created ({created}) must be epoch milliseconds (integer), got {found!r}")
        return InputEvent(client_id, event_id, found, body)
    return fields


def _shaped_parse(mapping: InputMapping, decoder: Decoder | None, exact: FieldsFunction) -> ParseFunction:
    """One function for the mapping's shape: its sources' common cases inline, chosen by flags
    fixed here, the rest by `exact` (from the decoded value, which is not decoded twice)."""
    client, uuid, created = mapping.sources()
    json_format, raw_format = mapping.format == "json", mapping.format == "raw"
    decode = _value_decoder(mapping, decoder)
    client_field, client_key, uuid_header, uuid_field = (client.kind == "field", client.kind == "key",
                                                         uuid.kind == "header", uuid.kind == "field")
    created_field = created.kind == "field"
    client_name, client_path, client_single = client.name, client.path, len(client.path) == 1
    uuid_name, uuid_path, uuid_single = uuid.name, uuid.path, len(uuid.path) == 1
    created_name, created_path, created_single = created.name, created.path, len(created.path) == 1
    reserved = _RESERVED_ID.encode()
    new_event = tuple.__new__  # InputEvent's own __new__ is a Python call more per record
    known: dict[object, str] = {}  # valid text clientIds by their key or header bytes (KNOWN_CLIENTS)

    def parse(key: bytes | None, value: bytes | None, headers: Headers, timestamp_ms: int) -> InputEvent:
        if value is None:
            raise BadEvent("missing-field", "record has no value")
        if len(value) > MAX_EVENT_BYTES:
            raise BadEvent("oversized", f"value is {len(value)} bytes, the limit is {MAX_EVENT_BYTES}")
        if json_format:
            try:
                body = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise BadEvent("not-json", str(exc)) from None
            if type(body) is not dict:
                raise BadEvent("not-an-object", f"value is a JSON {type(body).__name__}, expected an object (a dict)")
        else:
            body = decode(value)
            if not raw_format and type(body) is not dict:  # a dict's subclass: the getters know it
                return exact(key, body, headers, timestamp_ms)
        client_id: ClientId
        if client_field:
            found = body.get(client_name) if client_single else _nested_field(body, client_path)
            if type(found) is int:
                client_id = found
            elif type(found) is str and found and not found.startswith(_RESERVED_ID):
                client_id = int(found) if _CANONICAL_INT.fullmatch(found) else found
            else:
                return exact(key, body, headers, timestamp_ms)
        else:
            if client_key:
                raw = key
            elif type(headers) is list and headers and (last := headers[-1])[0] == client_name:
                raw = last[1]
            else:
                raw = _header(headers, client_name)
            # One str per client, not per record: its hash is then computed once, and every dict
            # keyed by clients (scheduler, states, slot) finds it by identity.
            known_id = known.get(raw)
            if known_id is not None:
                client_id = known_id
            else:
                if type(raw) is not bytes or not raw or raw.startswith(reserved):
                    return exact(key, body, headers, timestamp_ms)
                try:
                    client_id = raw.decode()
                except UnicodeDecodeError:
                    return exact(key, body, headers, timestamp_ms)
                if len(raw) <= KNOWN_CLIENT_BYTES:
                    if len(known) >= KNOWN_CLIENTS:
                        known.clear()
                    known[raw] = client_id
        event_id: str | None
        if uuid_header:
            if type(headers) is list and headers and (last := headers[-1])[0] == uuid_name:
                raw = last[1]
            else:
                raw = _header(headers, uuid_name)
            if type(raw) is not bytes or not raw:
                return exact(key, body, headers, timestamp_ms)
            try:
                event_id = raw.decode()
            except UnicodeDecodeError:
                return exact(key, body, headers, timestamp_ms)
        elif uuid_field:
            event_id = body.get(uuid_name) if uuid_single else _nested_field(body, uuid_path)
            if type(event_id) is not str or not event_id:
                return exact(key, body, headers, timestamp_ms)
        else:
            event_id = None
        if not created_field:
            return new_event(InputEvent, (client_id, event_id, timestamp_ms if timestamp_ms > 0 else 0, body))
        at = body.get(created_name) if created_single else _nested_field(body, created_path)
        if at is None:
            at = 0
        elif type(at) is not int:
            return exact(key, body, headers, timestamp_ms)
        return new_event(InputEvent, (client_id, event_id, at, body))
    return parse


def _nested_field(body: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The field at a dotted `path` through plain dicts, or None (whatever is missing or unusual)."""
    found: Any = body
    for name in path:
        if type(found) is not dict:
            return None
        found = found.get(name)
    return found


Getter = Callable[[bytes | None, Any, Headers], Any]
"""Finds one mapping's value in a record's key, decoded value and headers."""


def _client_getter(source: Source) -> Getter:
    if source.kind == "field":
        def field_client(key: bytes | None, body: Any, headers: Headers) -> ClientId:
            found = _find(body, source, "clientId", required=True)
            if type(found) is int:
                return found
            if type(found) is not str or not found:
                raise BadEvent("bad-field", f"clientId ({source}) must be an integer or non-empty text, got {found!r}")
            return int(found) if _CANONICAL_INT.fullmatch(found) else _not_reserved(source, found)
        return field_client
    text = _text_getter(source, "clientId")

    def text_client(key: bytes | None, body: Any, headers: Headers) -> ClientId:
        client_id: str = text(key, body, headers)
        return _not_reserved(source, client_id) if client_id.startswith(_RESERVED_ID) else client_id
    return text_client


def _not_reserved(source: Source, client_id: str) -> str:
    if client_id.startswith(_RESERVED_ID) and (client_id == _RESERVED_ID or client_id[len(_RESERVED_ID)] == "."):
        raise BadEvent("bad-field", f"clientId ({source}) {client_id!r} is reserved by keyrange")
    return client_id


def _text_getter(source: Source, what: str) -> Getter:
    """Non-empty text from the key, a header or a string field."""
    if source.kind == "field":
        def field_text(key: bytes | None, body: Any, headers: Headers) -> str:
            found = _find(body, source, what, required=True)
            if type(found) is not str or not found:
                raise BadEvent("bad-field", f"{what} ({source}) must be non-empty text, got {found!r}")
            return found
        return field_text
    from_key, name = source.kind == "key", source.name
    missing = ("record has no key" if from_key else f"record has no header {name!r}")

    def key_or_header_text(key: bytes | None, body: Any, headers: Headers) -> str:
        raw = key if from_key else _header(headers, name)
        if raw:
            try:
                return raw.decode()
            except UnicodeDecodeError:
                raise BadEvent("bad-field", f"{what} ({source}) is not UTF-8 text ({len(raw)} binary bytes): "
                                            "keyrange takes text ids only") from None
        if raw is None:
            raise BadEvent("missing-field", f"{what} ({source}): {missing}")
        raise BadEvent("bad-field", f"{what} ({source}) is empty")
    return key_or_header_text


def _find(body: Any, source: Source, what: str, required: bool) -> Any:
    found = body
    for name in source.path:
        if not isinstance(found, dict) or name not in found:
            if required:
                raise BadEvent("missing-field", f"{what} ({source}): value has no {source.name!r}")
            return None
        found = found[name]
    return found


def _header(headers: Headers, name: str) -> bytes | None:
    """The last header of that name (Kafka allows repeats; the newest wins, as in Kafka Streams);
    an empty value reads as b''."""
    if type(headers) is list:  # what confluent_kafka gives: no isinstance checks
        for header, value in reversed(headers):
            if header == name:
                return value if type(value) is bytes else _as_bytes(value)
        return None
    if not headers:
        return None
    if isinstance(headers, Mapping):
        return _as_bytes(headers[name]) if name in headers else None
    for header, value in reversed(headers):
        if header == name:
            return _as_bytes(value)
    return None


def _as_bytes(value: str | bytes | None) -> bytes:
    return value.encode() if isinstance(value, str) else value or b""
