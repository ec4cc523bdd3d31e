"""Wire formats (docs/design.md, "Wire contracts"): input events, processed records, dead
letters, and the records of the keyed-state changelog.

Input (the default mapping): key = clientId as decimal UTF-8, value = JSON with at least
`clientId` (int), `uuid` (string) and `created` (epoch ms); `spec.input` maps other topics
(inputmapping.py), where a clientId may be text. Processed: key = clientId, value = JSON with the input's
identity, where and when it was handled, and the handler's result. Dead letters keep the
original key and value and say why in headers. Processed records and dead letters carry the
consumer group that wrote them (header `keyrange.group`): several consumers may share one sink,
and a restore trusts only its own group's outputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias

import orjson

ClientId: TypeAlias = int | str
"""A client's id as found: an integer (the default mapping, or a JSON integer field) or non-empty text."""

MAX_EVENT_BYTES = 1_000_000
"""Input values larger than this are dead-lettered as oversized rather than parsed."""


def json_bytes(value: Any) -> bytes:
    """`value` as compact JSON, in a bytes object of its own size: orjson returns its whole working
    buffer (kilobytes for a short record), and a worker holds thousands of encoded values
    (BENCHMARKS.md, "Every encoded record held 4 KiB")."""
    return memoryview(orjson.dumps(value)).tobytes()

# Dead-letter header names: stable, documented in docs/worker.md.
DLQ_REASON = "keyrange.reason"
DLQ_DETAIL = "keyrange.detail"
DLQ_TOPIC = "keyrange.source.topic"
DLQ_PARTITION = "keyrange.source.partition"
DLQ_OFFSET = "keyrange.source.offset"
DLQ_ATTEMPTS = "keyrange.attempts"
DLQ_TRUNCATED = "keyrange.truncated"
"""On a dead letter too large for its topic only: the original value's size in bytes (the value is
then the event's identity, or empty; the original stays at its source offset)."""
DLQ_SOURCE_TIMESTAMP = "keyrange.source.timestamp"
"""On a dead letter under an input mapping other than the default: its record's timestamp (epoch ms)."""

GROUP_HEADER = "keyrange.group"
"""On every processed record and dead letter: the consumer group whose worker wrote it."""
STATE_HEADER = "keyrange.state"
"""On a processed record whose handler changed the client's state: the state after the event, as
JSON; `null` means deleted (a stored state is never null: `set(None)` deletes)."""
SOURCE_OFFSET_HEADER = DLQ_OFFSET
"""On a changelog record: the input offset of the event whose handler wrote the state (the same
name as a dead letter's source offset: both say which input offset a record stems from)."""
TOTALS_KEY = b"keyrange.totals"
"""Changelog key (never a clientId: the input mapping refuses this one) of a partition's totals record: how the
input offsets below its source offset finished, written in the transaction that commits them. A slot
that is a hash range inside a partition writes its own (`totals_key`)."""


def totals_key(part: int, parts: int) -> bytes:
    """The changelog key of a slot's totals record: TOTALS_KEY for a whole partition, else
    `keyrange.totals.<part>/<parts>` for the part-th of the partition's `parts` hash ranges."""
    return TOTALS_KEY if parts == 1 else b"%s.%d/%d" % (TOTALS_KEY, part, parts)


def is_totals_key(key: bytes | None) -> bool:
    """Whether a changelog key is a totals record's (a whole partition's or a hash range's)."""
    return key is not None and key.startswith(TOTALS_KEY) and (len(key) == len(TOTALS_KEY)
                                                               or key[len(TOTALS_KEY)] == 0x2E)
SNAPSHOT_HEADER = "keyrange.snapshot"
"""On a totals record: the changelog offset (decimal) where the newest snapshot of the partition's
keyed state that had committed when the record was written starts; a restore reads the changelog
from there (worker/snapshots.py). Absent: read it from its start."""


class BadEvent(ValueError):
    """An input record does not satisfy the wire contract; `reason` is a short stable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class InputEvent(NamedTuple):
    """One input event, parsed and checked. A NamedTuple rather than a frozen dataclass: one is made
    per event, and a frozen dataclass's __init__ (object.__setattr__ per field) took twice as long."""

    client_id: ClientId
    uuid: str | None
    """None when the input mapping has `uuid: none` (no deduplication)."""
    created_ms: int
    body: Any
    """What the handler gets: the whole JSON object (or the decoder's dict; the bytes with `format: raw`)."""


def parse_input(value: bytes | None) -> InputEvent:
    """Parse and check an input record value; raise BadEvent with a reason code on problems.

    Reason codes: `oversized`, `not-json`, `not-an-object`, `missing-field`, `bad-field`.
    """
    if value is None:
        raise BadEvent("missing-field", "record has no value")
    if len(value) > MAX_EVENT_BYTES:
        raise BadEvent("oversized", f"value is {len(value)} bytes, the limit is {MAX_EVENT_BYTES}")
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise BadEvent("not-json", str(exc)) from None
    if not isinstance(body, dict):
        raise BadEvent("not-an-object", f"value is a JSON {type(body).__name__}, expected an object")
    try:
        client_id = body["clientId"]
        uuid = body["uuid"]
    except KeyError as exc:
        raise BadEvent("missing-field", f"value has no {exc.args[0]!r}") from None
    created = body.get("created", 0)
    if type(client_id) is not int:
        raise BadEvent("bad-field", f"clientId must be an integer, got {client_id!r}")
    if type(uuid) is not str or not uuid:
        raise BadEvent("bad-field", f"uuid must be a non-empty string, got {uuid!r}")
    if type(created) is not int:
        raise BadEvent("bad-field", f"created must be epoch milliseconds (integer), got {created!r}")
    return InputEvent(client_id, uuid, created, body)


def encode_input(client_id: int, uuid: str, created_ms: int, **extra: Any) -> tuple[bytes, bytes]:
    """Key and value of an input event per the wire contract."""
    body = {"clientId": client_id, "uuid": uuid, "created": created_ms, **extra}
    return str(client_id).encode(), json_bytes(body)


def encode_identity(event: InputEvent) -> bytes:
    """The value of a truncated dead letter (DLQ_TRUNCATED) of a parsed event, under any input mapping:
    `{"clientId", "uuid", "created"}` as the intake found them (the default mapping's is an input value)."""
    return json_bytes({"clientId": event.client_id, "uuid": event.uuid, "created": event.created_ms})


def decode_identity(value: bytes | None) -> InputEvent:
    """The event identity a truncated dead letter's value holds (`encode_identity`), its body the identity
    itself; BadEvent when it holds none (bad input's dead letter, or one too large even for that)."""
    if value is None:
        raise BadEvent("missing-field", "truncated dead letter without the event's identity")
    try:
        body = orjson.loads(value)
        return InputEvent(body["clientId"], body["uuid"], int(body["created"] or 0), body)
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        raise BadEvent("bad-field", f"truncated dead letter's identity is not one: {exc}") from None


def encode_processed(
    event: InputEvent,
    partition: int,
    offset: int,
    worker: str,
    started_ms: int,
    finished_ms: int,
    result: Any,
    key: bytes | None = None,
) -> tuple[bytes, bytes]:
    """Key and value of a processed record per the wire contract; `key`, when given, is the key
    (str(clientId) as UTF-8) already encoded: a record key that is the clientId (`clientId: key`)."""
    value = json_bytes(
        {
            "clientId": event.client_id,
            "uuid": event.uuid,
            "created": event.created_ms,
            "partition": partition,
            "offset": offset,
            "worker": worker,
            "startedAt": started_ms,
            "finishedAt": finished_ms,
            "result": result,
        }
    )
    return key if key is not None else str(event.client_id).encode(), value


def decode_processed(value: bytes) -> dict[str, Any]:
    """Parse a processed record value (used by tests, the aggregation job and dedup restore)."""
    record = orjson.loads(value)
    if not isinstance(record, dict):
        raise BadEvent("not-an-object", "processed record is not a JSON object")
    return record


def dead_letter_headers(
    reason: str, detail: str, topic: str, partition: int, offset: int, attempts: int
) -> list[tuple[str, bytes]]:
    """Headers that say why a record was dead-lettered and where it came from."""
    return [
        (DLQ_REASON, reason.encode()),
        (DLQ_DETAIL, detail[:2000].encode("utf-8", "replace")),
        (DLQ_TOPIC, topic.encode()),
        (DLQ_PARTITION, str(partition).encode()),
        (DLQ_OFFSET, str(offset).encode()),
        (DLQ_ATTEMPTS, str(attempts).encode()),
    ]


def encode_totals(handled: int, dead_lettered: int, duplicates_dropped: int) -> bytes:
    """Value of a partition totals record (see TOTALS_KEY)."""
    return json_bytes({"handled": handled, "deadLettered": dead_lettered, "duplicatesDropped": duplicates_dropped})


def decode_totals(value: bytes) -> tuple[int, int, int]:
    """(handled, dead-lettered, duplicates dropped) from a totals record value."""
    body = orjson.loads(value)
    return int(body["handled"]), int(body["deadLettered"]), int(body["duplicatesDropped"])
