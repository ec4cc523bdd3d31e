"""What becomes of a fetched record: a job for its client, or an outcome at once.

In log order per partition: the record joins the partition's commit window; an offset a previous
owner already finished (its output exists past the committed offset) is skipped; bad input is
dead-lettered; a uuid already in the dedup window is dropped; anything else is a job, queued on
its client. Nothing here blocks the client: its later events keep flowing.

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
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Message

from keyrange.events import BadEvent, ClientId, InputEvent, parse_input
from keyrange.inputmapping import DEFAULT_MAPPING, Headers, InputMapping, InputParser
from keyrange.ranges.slots import partition_for_client
from keyrange.worker.commitwindow import Outcome
from keyrange.worker.outputs import OutputStage
from keyrange.worker.partition import PartitionState

log = logging.getLogger(__name__)

MAX_PLACED_CLIENTS = 100_000
"""Clients remembered per partition as correctly placed (checked once each); cleared past this."""


@dataclass(slots=True)
class Job:
    """One event waiting for (or in) its handler call."""

    ps: PartitionState
    offset: int
    event: InputEvent
    key: bytes | None
    value: bytes
    started_s: float = 0.0
    """When its first attempt started (wall clock, seconds); 0 before."""
    attempts: int = 0
    """Attempts made so far (an inline first attempt that failed leaves 1)."""
    failure: str = ""
    """The last failed attempt's error, for its dead letter."""
    record: tuple[Headers, int] | None = None
    """The record's headers and timestamp, which its dead letter keeps under an input mapping
    (outputs.py); None under the default mapping."""


class Intake:
    """Turns the records of held partitions into jobs or immediate outcomes (module docstring)."""

    __slots__ = ("_check_placements", "_outputs", "_parser", "_partition_count", "_skew_s", "_wall_clock")

    def __init__(self, partition_count: int, tolerated_skew_seconds: float, outputs: OutputStage,
                 wall_clock: Callable[[], float] = time.time, mapping: InputMapping = DEFAULT_MAPPING) -> None:
        self._parser: InputParser | None = None if mapping.is_default else mapping.parser
        """None: the default mapping, parsed by parse_input with no more work per event than before."""
        self._check_placements = mapping.client_id != "key"
        self._partition_count = partition_count
        self._skew_s = tolerated_skew_seconds
        self._outputs = outputs
        self._wall_clock = wall_clock

    def admit(self, ps: PartitionState, m: Message, offset: int) -> Job | None:
        """The job for record `m` at `offset` (the next one of `ps`), or None when it finished here."""
        window = ps.window
        timestamp_ms = m.timestamp()[1]
        value = m.value()
        window.add(offset, timestamp_ms, len(value) if value is not None else 0)
        finished = ps.skip.pop(offset, None)
        if finished is not None:
            # Finished by an earlier owner: its uuid joins the window here, at its place in the log.
            if finished.uuid is not None:
                ps.dedup.add_if_new(finished.uuid, finished.created_s)
            window.finish(offset, finished.outcome)
            return None
        if self._parser is not None:
            return self._admit_mapped(self._parser, ps, m, offset, value, timestamp_ms)
        try:
            event = parse_input(value)
        except BadEvent as exc:
            self._outputs.dead_letter(ps, offset, m.key(), value, exc.reason, exc.detail, 0)
            window.finish(offset, Outcome.DEAD_LETTERED)
            return None
        if event.client_id not in ps.placed_clients:
            self._check_placement(ps, event.client_id)
        # Event time is `created`; the record timestamp stands in when a producer left it out.
        event_s = (event.created_ms or timestamp_ms) / 1000
        self._check_skew(ps, event_s)
        # parse_input always finds a uuid (only a mapping's `uuid: none` leaves it None).
        if not ps.dedup.add_if_new(event.uuid, event_s):  # type: ignore[arg-type]
            # Counted when its offset commits: a drop whose offset never commits here is dropped,
            # and counted, by the slot's next owner.
            window.finish(offset, Outcome.DUPLICATE)
            return None
        # A record with a value always has bytes (parse_input rejected None).
        return Job(ps, offset, event, m.key(), value)  # type: ignore[arg-type]

    def _admit_mapped(self, parser: InputParser, ps: PartitionState, m: Message, offset: int, value: bytes | None,
                      timestamp_ms: int) -> Job | None:
        """`admit` after the skip, under a mapping other than the default (kept apart so that the
        default's per-event work stays what it was)."""
        headers = m.headers()
        key = m.key()
        record = (headers, timestamp_ms)
        try:
            event = parser.parse(key, value, headers, timestamp_ms)
        except BadEvent as exc:
            self._outputs.dead_letter(ps, offset, key, value, exc.reason, exc.detail, 0, record=record)
            ps.window.finish(offset, Outcome.DEAD_LETTERED)
            return None
        # With `clientId: key` the client's records share a partition whatever the partitioner.
        if self._check_placements and event.client_id not in ps.placed_clients:
            self._check_placement(ps, event.client_id)
        event_s = (event.created_ms or timestamp_ms) / 1000
        self._check_skew(ps, event_s)
        if event.uuid is not None and not ps.dedup.add_if_new(event.uuid, event_s):
            ps.window.finish(offset, Outcome.DUPLICATE)  # counted when its offset commits, as in `admit`
            return None
        return Job(ps, offset, event, key, value, record=record)  # type: ignore[arg-type]

    def _check_placement(self, ps: PartitionState, client_id: ClientId) -> None:
        expected = partition_for_client(client_id, self._partition_count)
        if expected == ps.partition:
            if len(ps.placed_clients) >= MAX_PLACED_CLIENTS:
                ps.placed_clients.clear()
            ps.placed_clients.add(client_id)
            return
        ps.metrics.misplaced.inc()
        if not ps.warned_misplaced:
            ps.warned_misplaced = True
            log.warning(
                "partition %d holds events of client %r, whose partition is %d (murmur2 of the key): its order and "
                "state are split over two partitions. Producers must key events by clientId and use Java's "
                "default partitioner (librdkafka: partitioner=murmur2_random). Counted in "
                "keyrange_misplaced_events_total; warned once per partition.", ps.partition, client_id, expected)

    def _check_skew(self, ps: PartitionState, event_s: float) -> None:
        if event_s > self._wall_clock() + self._skew_s:
            ps.metrics.skewed_ahead.inc()
        elif event_s < ps.dedup.stream_time - self._skew_s:
            ps.metrics.skewed_behind.inc()
