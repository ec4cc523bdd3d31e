"""Staging a partition's outputs for the next transaction: processed records, dead letters, state.

Every output says which consumer group wrote it (header `keyrange.group`), so consumers sharing a
sink or DLQ never take each other's outputs for their own on restore. An output goes to the
partition of its input event when the topic has the input's partition count, so a slot's outputs
live in one partition and a restore reads only that one.
"""

from __future__ import annotations

from keyrange.events import GROUP_HEADER, STATE_HEADER, ClientId, dead_letter_headers
from keyrange.inputmapping import Headers, record_headers
from keyrange.worker.partition import PartitionState
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.transactions import OutputRecord

RECORD_OVERHEAD_BYTES = 512
"""What a record adds to its key, value and headers in a batch (framing, offsets, timestamps), rounded
up generously: an output is refused a little early rather than failing its transaction."""


class OutputStage:
    """Adds outputs to their partition's batch; the committer takes the batch into a transaction."""

    __slots__ = ("_always_fits", "_group_header", "_max_bytes", "_same_layout", "_settings", "_sink")

    def __init__(self, settings: WorkerSettings, partition_counts: dict[str, int],
                 max_message_bytes: dict[str, int]) -> None:
        self._settings = settings
        self._group_header = (GROUP_HEADER, settings.group_id.encode())
        inputs = partition_counts[settings.topic]
        self._same_layout = {topic: n == inputs for topic, n in partition_counts.items()}
        self._max_bytes = max_message_bytes
        """Per output topic, the largest record its broker accepts (`max.message.bytes`)."""
        self._sink = settings.sink
        limits = [limit for topic, limit in max_message_bytes.items() if topic in (settings.sink, settings.state)]
        headers = len(GROUP_HEADER) + len(self._group_header[1]) + len(STATE_HEADER)
        self._always_fits = min(limits, default=2**62) - headers - RECORD_OVERHEAD_BYTES
        """Key, value and state bytes below which both records fit: `too_large` checks no further."""

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

    def processed(self, ps: PartitionState, offset: int, client_id: ClientId, key: bytes, value: bytes,
                  state_json: bytes | None, state_deleted: bool) -> None:
        """Stage a handled event's processed record, and its client's new state if the handler
        changed it (`state_json`, or `state_deleted`). The state rides on the processed record too,
        so "handled" and "its state" are one record that no torn transaction can split
        (rebuild.py); the store keeps the encoded value, what the changelog restores."""
        headers = [self._group_header]
        if state_deleted:
            ps.store.pop(client_id, None)
            ps.dirty_state[client_id] = (None, offset)
            headers.append((STATE_HEADER, b"null"))
        elif state_json is not None:
            ps.store[client_id] = state_json
            ps.dirty_state[client_id] = (state_json, offset)
            headers.append((STATE_HEADER, state_json))
        ps.outputs.append(OutputRecord(self._sink, ps.output_partition, key, value, headers))
        ps.processed_uncommitted += 1

    def dead_letter(self, ps: PartitionState, offset: int, key: bytes | None, value: bytes | None,
                    reason: str, detail: str, attempts: int, record: tuple[Headers, int] | None = None) -> None:
        """Stage a dead letter: the original key and value (and `record`'s headers and timestamp,
        under an input mapping), and headers saying why and from where."""
        s = self._settings
        headers = [*(record_headers(*record) if record is not None else ()),
                   *dead_letter_headers(reason, detail, s.topic, ps.partition, offset, attempts), self._group_header]
        ps.outputs.append(OutputRecord(s.dlq, self.output_partition(s.dlq, ps.partition), key, value, headers))
        ps.dead_letters_uncommitted.append(reason)
