"""The records a slot's events produce: processed records (with the client's state) and dead letters.

Pure: `Outputs` holds the output topics' layout and limits (fixed once the worker started) and
builds records from values; it stages nothing. attempts.py and intake.py hand what it builds to
the slot (slot.py), which stages it for the committer.

Every output says which consumer group wrote it (header `keyrange.group`), so consumers sharing a
sink or DLQ never take each other's outputs for their own on restore. An output goes to the
partition of its input event when the topic has the input's partition count, so a slot's outputs
live in one partition and a restore reads only that one.

No output may be larger than its topic's `max.message.bytes` (or the producer's own limit): such a
record would fail its transaction on every try, and the slot would hit the same event again after
each re-acquire. A processed record that would be is dead-lettered instead (`too_large`); a dead
letter that would be is truncated (`dead_letter`): its value becomes the event's identity (what a
restore needs to rebuild the dedup window) or nothing, with header `keyrange.truncated`, so the
event still ends its offset.
"""

from __future__ import annotations

import logging

from keyrange.events import (
    DLQ_TRUNCATED,
    GROUP_HEADER,
    STATE_HEADER,
    InputEvent,
    dead_letter_headers,
    encode_identity,
)
from keyrange.inputmapping import SourceRecord, kept_headers
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.transactions import PRODUCER_MAX_MESSAGE_BYTES, OutputRecord

log = logging.getLogger(__name__)

PRODUCER_BATCH_BYTES = 1_000_000
"""librdkafka's default `batch.size`."""

RECORD_OVERHEAD_BYTES = 512
"""What a record adds to its key, value and headers in a batch (framing, offsets, timestamps), rounded
up generously: an output is refused a little early rather than failing its transaction."""


class Outputs:
    """Builds the records of handled and dead-lettered events for the output topics (module docstring)."""

    __slots__ = ("_always_fits", "_dlq_max_bytes", "_group_header", "_max_bytes", "_same_layout", "_settings", "_sink")

    def __init__(self, settings: WorkerSettings, partition_counts: dict[str, int],
                 max_message_bytes: dict[str, int]) -> None:
        self._settings = settings
        self._group_header = (GROUP_HEADER, settings.group_id.encode())
        inputs = partition_counts[settings.topic]
        self._same_layout = {topic: n == inputs for topic, n in partition_counts.items()}
        self._max_bytes = {topic: min(limit, PRODUCER_MAX_MESSAGE_BYTES) for topic, limit in max_message_bytes.items()}
        """Per output topic, the largest record its broker (`max.message.bytes`) and the producer accept."""
        self._dlq_max_bytes = self._max_bytes.get(settings.dlq, PRODUCER_MAX_MESSAGE_BYTES)
        self._sink = settings.sink
        limits = [limit for topic, limit in self._max_bytes.items() if topic in (settings.sink, settings.state)]
        headers = len(GROUP_HEADER) + len(self._group_header[1]) + len(STATE_HEADER)
        self._always_fits = min(limits, default=2**62) - headers - RECORD_OVERHEAD_BYTES
        """Key, value and state bytes below which both records fit: `too_large` checks no further."""

    @property
    def batch_bytes(self) -> int | None:
        """The largest record batch a slot's producer may build so that every output topic takes it
        (librdkafka's `batch.size`), or None when its default (1,000,000 bytes) fits them all. A
        batch holds at least one record, and every record fits its topic on its own (`too_large`,
        `dead_letter`); records that fit one by one could still make a batch over a topic's limit."""
        smallest = min(self._max_bytes.values(), default=PRODUCER_BATCH_BYTES) - RECORD_OVERHEAD_BYTES
        return max(1, smallest) if smallest < PRODUCER_BATCH_BYTES else None

    def too_large(self, key: bytes, value: bytes, state_json: bytes | None) -> str | None:
        """Why a handled event's outputs cannot be written (one over its topic's limit), or None.

        A record over the limit would fail its transaction on every retry and stop the worker,
        which would then crash-loop on the same event; it goes to the dead-letter topic instead."""
        if len(key) + len(value) + (len(state_json) if state_json is not None else 0) <= self._always_fits:
            return None
        s = self._settings
        headers = len(GROUP_HEADER) + len(self._group_header[1])
        if state_json is not None:
            headers += len(STATE_HEADER) + len(state_json)
        processed = len(key) + len(value) + headers + RECORD_OVERHEAD_BYTES
        limit = self._max_bytes.get(s.sink)
        if limit is not None and processed > limit:
            return (f"the processed record would be {processed:,} bytes (result and state), over {s.sink!r}'s "
                    f"max.message.bytes of {limit:,}")
        limit = self._max_bytes.get(s.state)
        if state_json is not None and limit is not None and len(key) + len(state_json) + RECORD_OVERHEAD_BYTES > limit:
            return (f"the client's new state is {len(state_json):,} bytes, over {s.state!r}'s max.message.bytes "
                    f"of {limit:,}")
        return None

    def output_partition(self, topic: str, partition: int) -> int | None:
        """Where `partition`'s records go in `topic` (None: the producer picks by key)."""
        return partition if self._same_layout[topic] else None

    def processed(self, output_partition: int | None, key: bytes, value: bytes, state_json: bytes | None,
                  state_deleted: bool) -> OutputRecord:
        """A handled event's processed record, with its client's new state if the handler changed
        it (`state_json`, or `state_deleted`): "handled" and "its state" are one record that no
        torn transaction can split (restore.py)."""
        headers = [self._group_header]
        if state_deleted:
            headers.append((STATE_HEADER, b"null"))
        elif state_json is not None:
            headers.append((STATE_HEADER, state_json))
        return OutputRecord(self._sink, output_partition, key, value, headers)

    def dead_letter(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
                    reason: str, detail: str, attempts: int, event: InputEvent | None = None,
                    record: SourceRecord | None = None) -> OutputRecord | None:
        """The dead letter of the event at `offset` of input `partition`: the original key and value
        (and `record`'s headers and timestamp, under an input mapping), and headers saying why and
        from where; truncated when it would be over the dead-letter topic's limit (module docstring;
        `event`, the parsed event if there is one, gives the identity a truncated value keeps).
        None when it fits nowhere even without key and value: not written, its offset ends anyway."""
        s = self._settings
        headers = [*(kept_headers(record) if record is not None else ()),
                   *dead_letter_headers(reason, detail, s.topic, partition, offset, attempts), self._group_header]
        if not self._fits(key, value, headers):
            key, value = self._truncated(partition, offset, key, value, headers, event)
            if key is None and value is None and not self._fits(None, None, headers):
                log.error("the dead letter of partition %d offset %d does not fit topic %r even without its key and "
                          "value (max.message.bytes %d): not written, its offset ends anyway. Raise the topic's "
                          "max.message.bytes.", partition, offset, s.dlq, self._dlq_max_bytes)
                return None
        return OutputRecord(s.dlq, self.output_partition(s.dlq, partition), key, value, headers)

    def _truncated(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
                   headers: list[tuple[str, bytes]], event: InputEvent | None) -> tuple[bytes | None, bytes | None]:
        """The key and value a dead letter over the limit keeps; adds the header saying so to `headers`."""
        size = len(value) if value is not None else 0
        headers.append((DLQ_TRUNCATED, str(size).encode()))
        # The identity keeps the uuid in the DLQ, where a restore finds it (restore.py), under any mapping.
        value = None if event is None else encode_identity(event)
        if not self._fits(key, value, headers):
            key = None
        if not self._fits(key, value, headers):
            value = None
        log.warning("the dead letter of partition %d offset %d (a %d-byte value) is over %r's max.message.bytes of %d: "
                    "written with %s instead; the original stays in %r", partition, offset, size,
                    self._settings.dlq, self._dlq_max_bytes, "the event's identity" if value else "no value",
                    self._settings.topic)
        return key, value

    def _fits(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> bool:
        size = len(key or b"") + len(value or b"") + sum(len(name) + len(v) for name, v in headers)
        return size + RECORD_OVERHEAD_BYTES <= self._dlq_max_bytes
