"""What becomes of a fetched record: a job for its client, or an outcome at once.

Called by the engine's dispatch for each fetched record of a held slot (engine.py); it returns
the job, which the engine queues on its client (scheduler.py). In log order per slot: the record
joins the slot's commit window; an offset a previous owner already finished (its output exists
past the committed offset) is skipped; bad input is dead-lettered; a uuid already in the dedup
window is dropped; anything else is a job. Every one of these steps is a method of the slot
(slot.py), which alone writes its state. Nothing here blocks the client: its later events keep
flowing.

Records are parsed under the consumer's input mapping (inputmapping.py); the default one is the
wire contract, parsed by `parse_input` directly (the hot path).

Two producer mistakes are counted here, because they silently weaken guarantees:
- a record on a partition other than murmur2(clientId)'s splits the client's order and state
  over two partitions (`keyrange_misplaced_events_total`, and one warning per partition). With
  `clientId: key` a client's records share a partition whatever the producer's partitioner, so
  nothing is checked; with `field:` or `header:` the producer must key each record by its clientId;
- a `created` ahead of the worker's clock, or behind the partition's stream time, by more than
  the tolerated skew (`keyrange_clock_skewed_events_total`). The dedup window bounds such a time
  either way (dedup.py), so dedup still works; the skew is reported because past it a restore's
  time-based reads (restore.py) may start too late to rebuild the window exactly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Set
from typing import Protocol

from confluent_kafka import Message

from keyrange.events import BadEvent, ClientId, parse_input
from keyrange.inputmapping import DEFAULT_MAPPING, InputMapping, ParseFunction
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.slots import partition_for_client
from keyrange.worker.attempts import AttemptSlot, Job
from keyrange.worker.outputs import Outputs
from keyrange.worker.slot import SlotMetrics

log = logging.getLogger(__name__)


class IntakeSlot(AttemptSlot, Protocol):
    """What the intake needs of a held slot (slot.py's SlotState); its jobs' slot is an AttemptSlot."""

    @property
    def metrics(self) -> SlotMetrics:
        """The slot's metric children."""

    @property
    def placed_clients(self) -> Set[ClientId]:
        """Clients found on their murmur2 partition here."""

    @property
    def slot(self) -> int:
        """The slot's number in the range map."""

    @property
    def stream_time(self) -> float:
        """The newest event time the dedup window has seen (seconds)."""

    def admit(self, offset: int, timestamp_ms: int, size_bytes: int) -> bool:
        """Add a fetched offset; False when there is nothing to run (revoked, seen, finished earlier)."""

    def first_seen(self, offset: int, uuid: str, event_s: float) -> bool:
        """Whether `uuid` is new; a duplicate's offset finishes."""

    def place(self, client: ClientId) -> None:
        """Remember that `client` belongs here."""

    def first_misplaced(self) -> bool:
        """True the first time a misplaced client is found here."""


class Intake:
    """Turns the records of held slots into jobs or immediate outcomes (module docstring)."""

    __slots__ = ("_check_placements", "_outputs", "_parse", "_partition_count", "_reads_headers", "_skew_s",
                 "_wall_clock", "layout")

    def __init__(self, partition_count: int, tolerated_skew_seconds: float, outputs: Outputs,
                 wall_clock: Callable[[], float] = time.time, mapping: InputMapping = DEFAULT_MAPPING) -> None:
        self.layout = SlotLayout(partition_count)
        """The slots' layout (the engine's): a hash range's clients must be keyed by their clientId."""
        self._parse: ParseFunction | None = None if mapping.is_default else mapping.parser.parse
        """None: the default mapping, parsed by parse_input with no more work per event than before."""
        self._reads_headers = mapping.reads_headers
        self._check_placements = mapping.client_id != "key"
        self._partition_count = partition_count
        self._skew_s = tolerated_skew_seconds
        self._outputs = outputs
        self._wall_clock = wall_clock

    def admit(self, slot: IntakeSlot, m: Message, offset: int) -> Job | None:
        """The job for record `m` at `offset` (the next one of `slot`), or None when it finished here."""
        timestamp_ms = m.timestamp()[1]
        value = m.value()
        if not slot.admit(offset, timestamp_ms, len(value) if value is not None else 0):
            return None  # finished by an earlier owner
        if self._parse is not None:
            # Under a mapping other than the default, here rather than in a method of its own (a call
            # per record); the default's per-event work below stays what it was. The record's headers
            # are read only if the mapping reads one: converting them is most of what a header costs.
            key = m.key()
            try:
                mapped = self._parse(key, value, m.headers() if self._reads_headers else None, timestamp_ms)
            except BadEvent as exc:
                slot.finish_dead_lettered(offset, self._outputs.dead_letter(
                    slot.partition, offset, key, value, exc.reason, exc.detail, 0, record=m), exc.reason)
                return None
            # With `clientId: key` the client's records share a partition whatever the partitioner.
            if self._check_placements and mapped.client_id not in slot.placed_clients:
                self._check_placement(slot, mapped.client_id)
            event_s = (mapped.created_ms or timestamp_ms) / 1000
            if event_s > self._wall_clock() + self._skew_s:  # the skew check below
                slot.metrics.skewed_ahead.inc()
            elif event_s < slot.stream_time - self._skew_s:
                slot.metrics.skewed_behind.inc()
            if mapped.uuid is not None and not slot.first_seen(offset, mapped.uuid, event_s):
                return None  # a duplicate, as below
            # The Message itself: its headers are converted only if it is dead-lettered. Positional
            # (started_s, attempts, failure, record): a keyword makes the call build a dict per record.
            return Job(slot, offset, mapped, key, value, 0.0, 0, "", m)  # type: ignore[arg-type]
        try:
            event = parse_input(value)
        except BadEvent as exc:
            key = m.key()
            slot.finish_dead_lettered(offset, self._outputs.dead_letter(
                slot.partition, offset, key, value, exc.reason, exc.detail, 0), exc.reason)
            return None
        if event.client_id not in slot.placed_clients:
            self._check_placement(slot, event.client_id)
        # Event time is `created`; the record timestamp stands in when a producer left it out.
        event_s = (event.created_ms or timestamp_ms) / 1000
        if event_s > self._wall_clock() + self._skew_s:  # the skew check (module docstring), inline
            slot.metrics.skewed_ahead.inc()
        elif event_s < slot.stream_time - self._skew_s:
            slot.metrics.skewed_behind.inc()
        # parse_input always finds a uuid (only a mapping's `uuid: none` leaves it None).
        if not slot.first_seen(offset, event.uuid, event_s):  # type: ignore[arg-type]
            return None  # a duplicate: counted when its offset commits
        # A record with a value always has bytes (parse_input rejected None).
        return Job(slot, offset, event, m.key(), value)  # type: ignore[arg-type]

    def _check_placement(self, slot: IntakeSlot, client_id: ClientId) -> None:
        expected = partition_for_client(client_id, self._partition_count)
        layout = self.layout
        if expected == slot.partition:
            if not layout.splits_partitions or layout.slot_for_key(expected, str(client_id).encode()) == slot.slot:
                slot.place(client_id)
                return
            # Routed by a record key other than its clientId: its events may fall in two hash ranges.
            slot.metrics.misplaced.inc()
            if slot.first_misplaced():
                log.warning(
                    "slot %s holds events of client %r keyed otherwise than by its clientId: with partitions cut "
                    "into hash ranges its order and state may be split over two of them. Producers must key events "
                    "by clientId. Counted in keyrange_misplaced_events_total; warned once per slot.",
                    layout.describe_slot(slot.slot), client_id)
            return
        slot.metrics.misplaced.inc()
        if slot.first_misplaced():
            log.warning(
                "partition %d holds events of client %r, whose partition is %d (murmur2 of the key): its order and "
                "state are split over two partitions. Producers must key events by clientId and use Java's "
                "default partitioner (librdkafka: partitioner=murmur2_random). Counted in "
                "keyrange_misplaced_events_total; warned once per partition.", slot.partition, client_id, expected)
