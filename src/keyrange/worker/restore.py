"""Rebuilding a partition's dedup window, finished offsets and keyed state from the logs.

On acquire (and on start) nothing is trusted from memory. For each input partition, with C its
committed offset:
- the input before C, from TTL (plus clock slack) before the window's stream time there, gives
  the uuids the window must hold (everything below C is finished); the window is in event time
  (see dedup.py), so it is rebuilt exactly. That stream time is the newest event time of the
  records just before C, capped at now (`plan_reads`): not the time of the record at C, which
  may be any producer's, nor now, which for a partition idle since C is past its window;
- the sink and dead-letter records of offsets >= C are events that finished after the last
  commit (outputs commit in the same transaction as offsets, and events finish out of order):
  they are skipped, not run again, and their uuids join the window when the new owner's fetch
  reaches them, so every event, finished or not, is judged at its own place in the log;
- keyed state: the changelog (`<group>.state`) is read from the snapshot that the newest totals
  record counting up to at most C names, or from its start when none does (snapshots.py: this
  bounds the read whatever the uptime); its entries whose source offset (header
  `keyrange.source.offset`) is < C are folded in log order, each client's only while its source
  offset does not go back (a fenced owner's record can land after its successor's on tansu: an
  older state), entries >= C are ignored; then the
  state headers (`keyrange.state`) of the processed records of offsets >= C (exactly the events
  marked finished above) are applied in offset order. The new owner writes the states those set
  to the changelog again (`RestoredPartition.from_outputs`): a torn transaction can show a
  processed record without its changelog record, and once the committed offset passes that
  event a restore reads its state from the changelog only;
- the partition's totals (how the offsets below C finished): the newest totals record of the
  changelog that counts up to at most C (worker/totals.py); it follows the snapshot it names.
Only outputs this consumer group wrote count (header `keyrange.group`): other consumers of the
same input may share the sink and the DLQ. The window is replayed in log order, as the engine saw
the events, because an event is remembered at the stream time it arrived at (dedup.py).
Everything here is blocking and runs on a thread of its own.

The state is right whatever prefix of a transaction became visible (a tansu workaround: tansu
commits a dead owner's open transaction torn, Kafka aborts it): changelog entries >= C are
ignored and each finished event >= C carries its state in its own processed record. The full
argument, and why it is the plain changelog's state on Kafka, is in docs/worker.md (Restore, step 3).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Message

from keyrange.events import (
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_TRUNCATED,
    GROUP_HEADER,
    SOURCE_OFFSET_HEADER,
    STATE_HEADER,
    BadEvent,
    ClientId,
    decode_identity,
    decode_processed,
    decode_totals,
    is_totals_key,
)
from keyrange.inputmapping import InputParser, source_timestamp
from keyrange.logend import Span
from keyrange.ranges.layout import SlotLayout, SlotRouter
from keyrange.worker.commitwindow import Outcome, Totals
from keyrange.worker.dedup import window_seconds
from keyrange.worker.logreader import LogReader
from keyrange.worker.pacing import Pacer
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.snapshots import changelog_starts, slot_totals_key, snapshot_named


@dataclass(frozen=True, slots=True)
class Finished:
    """An offset at or past the committed one that an earlier owner already finished."""

    outcome: Outcome
    uuid: str | None
    """Its event's uuid (None for bad input): it joins the dedup window when the fetch passes it."""
    created_s: float
    """Its event's `created` (seconds); 0 when it has none: then its record's timestamp, as at the intake."""


@dataclass
class RestoredPartition:
    """What a worker needs to take over one partition."""

    start_offset: int
    """Where fetching resumes: the committed offset, or the first offset when none is committed."""
    finished_offsets: dict[int, Finished] = field(default_factory=dict)
    """Offsets >= start_offset already handled or dead-lettered: skipped, not run again; their
    uuids join the dedup window as the fetch passes them, in log order (see `fold_logs`)."""
    seen: list[tuple[str, float]] = field(default_factory=list)
    """(uuid, event time in seconds) of the input before the committed offset that the dedup
    window must hold, in log order (the window remembers an event at the stream time it arrived
    at: dedup.py)."""
    state: dict[ClientId, Any] = field(default_factory=dict)
    """Keyed state per clientId."""
    state_offsets: dict[ClientId, int] = field(default_factory=dict)
    """Per clientId in `state`, the input offset of the event that set it (unless written before
    the changelog said so); a snapshot writes it with the state."""
    totals: Totals = field(default_factory=Totals)
    """How the offsets below start_offset finished (the newest totals record the commit covers)."""
    counted_to: int | None = None
    """The offset that totals record counts up to (None: the logs read held none for the slot)."""
    snapshot_start: int | None = None
    """The changelog snapshot that totals record names (snapshots.py; None: none)."""
    changelog_records: int = 0
    """Changelog records the restore read: the records since that snapshot, for when the next is due."""
    from_outputs: dict[ClientId, int] = field(default_factory=dict)
    """Per clientId whose state a processed record at or past the committed offset set, that record's
    offset. Its changelog record may be missing (a torn transaction on tansu), and a restore from a
    later committed offset reads only the changelog: the new owner writes these states again."""


def restore(settings: WorkerSettings, start_offsets: dict[int, int], partition_counts: dict[str, int],
            now_s: float | None = None, layout: SlotLayout | None = None) -> dict[int, RestoredPartition]:
    """Restore every slot in `start_offsets` (slot -> the offset it resumes from: positions.py)
    under `layout` (default: one slot per partition, a slot is its partition). A slot that is a
    hash range of a partition keeps of each log only its own clients' records (`SlotRouter`).

    Five round trips on one consumer: the last records before each committed offset and the one
    at it; the offsets at the window's and the outputs' start times; the changelog's bounds and its
    last records (where its snapshot starts: snapshots.py; more steps back only when those hold no
    totals record the committed offset covers); then the input window, the sink, the dead letters
    and the changelog from its snapshot, all in one assignment.
    """
    reader = LogReader(settings)
    try:
        return restore_with(reader, settings, start_offsets, partition_counts, now_s, layout)
    finally:
        reader.close()


def restore_with(reader: LogReader, settings: WorkerSettings, start_offsets: dict[int, int],
                 partition_counts: dict[str, int], now_s: float | None,
                 layout: SlotLayout | None = None, parsed: ParsedLogs | None = None) -> dict[int, RestoredPartition]:
    """`restore` on a given reader; the records read are parsed into `parsed` when given."""
    layout = layout or SlotLayout(partition_counts[settings.topic])
    plan = plan_reads(reader, settings, start_offsets, partition_counts, now_s, layout=layout)
    parsed = ParsedLogs() if parsed is None else parsed
    reader.read(plan.starts, input_stops(settings.topic, start_offsets, layout),
                each=lambda span, messages: parsed.add(settings, span, messages))
    return fold_logs(start_offsets, parsed, layout)


def input_stops(topic: str, start_offsets: dict[int, int], layout: SlotLayout) -> dict[Span, int]:
    """Where the input is read to: the highest offset a slot of each partition resumes from (the
    window is what lies before it)."""
    stops: dict[Span, int] = {}
    for slot, offset in start_offsets.items():
        span = (topic, layout.partition_of(slot))
        stops[span] = max(stops.get(span, offset), offset)
    return stops


TAIL_RECORDS = 64
"""Records a restore reads just before each committed offset to find the window's stream time there
(the newest event time among them; one record with an odd `created` cannot move it)."""


@dataclass
class ReadPlan:
    """Where a restore's reads start, and the times they start from."""

    starts: dict[Span, int]
    """Input (the dedup window before the committed offset), sink and DLQ (outputs of offsets at or
    after it) and changelog (from its newest snapshot: snapshots.py) spans, with their first offsets."""
    stream_ms: dict[int, int]
    """Per slot, the dedup window's stream time at the committed offset as the records before it
    tell (never later than it was, within the clock slack): the input is read from TTL before."""
    written_ms: dict[int, int]
    """Per slot, a time no later than when the outputs of offsets at or after the committed one
    were written (within the clock slack): the newest record timestamp up to that offset that is not
    past now, or now when the partition ends there."""


def plan_reads(reader: LogReader, settings: WorkerSettings, start_offsets: dict[int, int],
               partition_counts: dict[str, int], now_s: float | None, skip_ended: bool = True,
               layout: SlotLayout | None = None) -> ReadPlan:
    """Two round trips: the last records before each slot's committed offset and the record at it,
    then the offsets at the window's and the outputs' start times. With `skip_ended`, slots whose
    partition ends at their committed offset get no output spans (nothing past the offset has run).
    Then the changelog's snapshot (snapshots.py `changelog_starts`)."""
    now_ms = int((time.time() if now_s is None else now_s) * 1000)
    slack_ms = int(settings.restore_clock_slack_seconds * 1000)
    topic = settings.topic
    layout = layout or SlotLayout(partition_counts[topic])
    router = SlotRouter(layout)
    slots = list(start_offsets)
    lowest: dict[int, int] = {}
    highest: dict[int, int] = {}
    for s, o in start_offsets.items():
        p = layout.partition_of(s)
        lowest[p], highest[p] = min(lowest.get(p, o), o), max(highest.get(p, o), o)
    # A hash-range slot holds one in per_partition of its partition's records: read as many more.
    tail_records = TAIL_RECORDS * layout.per_partition
    tails, ends = reader.read({(topic, p): max(0, o - tail_records) for p, o in lowest.items()},
                              {(topic, p): o + 1 for p, o in highest.items()})
    stream_ms: dict[int, int] = {}
    written_ms = dict.fromkeys(slots, now_ms)
    parser = settings.input_mapping.parser
    parsed_tails = {p: [(_input_entry(parser, m), m.key()) for m in tails.get((topic, p), [])] for p in lowest}
    for s, committed in start_offsets.items():
        p = layout.partition_of(s)
        tail = [e for e, _ in parsed_tails[p] if e.offset <= committed]
        before = [e for e, key in parsed_tails[p] if e.offset < committed and router.slot_of(p, key) == s]
        # The window's clock is the newest event time before C, capped at the wall clock (dedup.py),
        # so neither the record at C nor a late record before it can pull it back, and an idle
        # partition keeps the stream time its last events gave it, not now. An event stamped past
        # now moved it to when its owner saw it, which is not known (TtlSet.replay): left out.
        event_ms = [int(e.event_s * 1000) for e in before if e.uuid is not None]
        if any(ms <= now_ms for ms in event_ms):
            stream_ms[s] = max(ms for ms in event_ms if ms <= now_ms)
        elif event_ms:
            stream_ms[s] = now_ms - slack_ms  # all ahead of this clock: by the slack at most, or skewed
        elif before or (committed > 0 and layout.splits_partitions and tail and tail[0].offset > 0):
            # Only bad input in the tail, or none of this slot's records among the partition's
            # last ones: the window's clock is older, read it all.
            stream_ms[s] = 0
        if any(e.offset >= committed for e in tail):
            # An output of an offset >= C was written after the record at C was appended, so after
            # every record before it was: the newest timestamp among them bounds it from below
            # (one stamped past now says nothing about when it was appended).
            stamped = [e.timestamp_ms for e in tail if e.timestamp_ms <= now_ms]
            written_ms[s] = max(stamped) if stamped else now_ms - slack_ms
    # A slot whose partition ends at its committed offset has no event at or past it, so no output
    # of one to find (a transaction marker at the offset does not count: records may follow it).
    ended = {s for s in slots if ends[(topic, layout.partition_of(s))] <= start_offsets[s]} if skip_ended else set()

    window_ms = int(window_seconds(settings.ttl_seconds) * 1000) + 1
    times: dict[Span, int] = {}
    for s, ms in stream_ms.items():
        span = (topic, layout.partition_of(s))
        times[span] = min(times.get(span, now_ms), max(0, ms - window_ms - slack_ms))
    outputs_from_ms = max(0, min(written_ms.values(), default=now_ms) - slack_ms)
    input_count = partition_counts[topic]
    for out_topic in (settings.sink, settings.dlq):
        if partition_counts[out_topic] == input_count:
            for s in slots:
                if s not in ended:
                    span = (out_topic, layout.partition_of(s))
                    times[span] = min(times.get(span, now_ms), max(0, written_ms[s] - slack_ms))
        elif not ended.issuperset(slots):
            times.update({(out_topic, p): outputs_from_ms for p in range(partition_counts[out_topic])})
    offsets = reader.offsets_at(times)

    # Input just before the committed offsets (the uuids the dedup window holds there), the outputs
    # of offsets >= C, and the changelog from the snapshot the committed offsets vouch for.
    starts = dict(offsets)
    starts.update(changelog_starts(reader, settings.state, start_offsets, layout))
    return ReadPlan(starts, stream_ms, written_ms)


@dataclass(frozen=True, slots=True)
class InputEntry:
    """An input record, as restore needs it."""

    offset: int
    timestamp_ms: int
    uuid: str | None
    """None for a record that is not a valid event."""
    event_s: float
    key: bytes | None = None
    """The record's key, which routes it to its slot (layout.py)."""


@dataclass(frozen=True, slots=True)
class OutputEntry:
    """A processed record or dead letter: the event it finished and the client's state after it."""

    partition: int
    offset: int
    uuid: str | None
    created_s: float
    """As `Finished.created_s`: 0 when the event has no `created`."""
    state: tuple[ClientId, Any] | None
    """(clientId, state after the event; None = deleted) when the handler changed the state."""
    outcome: Outcome
    key: bytes | None = None
    """What routes it to its slot as its input record was: the clientId's text (the input's key)
    for a processed record, the input's own key for a dead letter."""


@dataclass(frozen=True, slots=True)
class StateEntry:
    """A changelog record."""

    client: ClientId
    source_offset: int | None
    """Input offset of the event whose handler wrote it; None for records older than that header."""
    state: Any
    """None = deleted."""


@dataclass(frozen=True, slots=True)
class TotalsEntry:
    """A totals record."""

    counted_to: int
    """The input offset it counts up to (exclusive)."""
    totals: Totals
    snapshot_start: int | None
    """The changelog snapshot it names (snapshots.py), if any."""
    key: bytes = b""
    """Its slot's totals key (events.totals_key)."""


@dataclass
class ParsedLogs:
    """The records a restore read, parsed once (a read-ahead parses its part before the grant)."""

    inputs: dict[int, list[InputEntry]] = field(default_factory=dict)
    """Per input partition, in offset order."""
    outputs: list[OutputEntry] = field(default_factory=list)
    """This consumer group's processed records and dead letters (other groups' are left out)."""
    states: dict[int, list[StateEntry]] = field(default_factory=dict)
    """Per changelog partition, in log order."""
    totals: dict[int, list[TotalsEntry]] = field(default_factory=dict)
    """Per changelog partition, in log order (every slot's of the partition)."""
    pacer: Pacer = field(default_factory=Pacer, repr=False, compare=False)
    """Parsing and folding step aside for the worker's event loop now and then (pacing.py): a
    restore runs on a thread beside it, and the slots that did not move go on meanwhile."""
    read: dict[Span, tuple[int, int]] = field(default_factory=dict, compare=False)
    """Per span, the first offset and the offset after the last of the records added (what a
    restore's log line says it read)."""

    def add(self, settings: WorkerSettings, span: Span, messages: Sequence[Message]) -> None:
        """Parse `messages` of `span` (records after those added for it before)."""
        topic, partition = span
        if messages:
            first, after = messages[0].offset(), messages[-1].offset()
            if first is not None and after is not None:
                self.read[span] = (self.read.get(span, (first, 0))[0], after + 1)
        parser = settings.input_mapping.parser
        paced = self.pacer.paced(messages)
        if topic == settings.topic:
            self.inputs.setdefault(partition, []).extend(_input_entry(parser, m) for m in paced)
        elif topic in (settings.sink, settings.dlq):
            group = settings.group_id.encode()
            # Several consumer groups may share a sink and a DLQ: only this group's outputs say
            # what this group finished. Outputs without the header predate it and are not trusted.
            ours = (m for m in paced if _header(m, GROUP_HEADER) == group)
            if topic == settings.dlq:
                self.outputs.extend(e for m in ours if (e := _dead_letter_entry(parser, m)) is not None)
            else:
                self.outputs.extend(e for m in ours if (e := _processed_entry(m)) is not None)
        elif topic == settings.state:
            for m in paced:
                if is_totals_key(m.key()):
                    if (totals := _totals_entry(m)) is not None:
                        self.totals.setdefault(partition, []).append(totals)
                elif (change := _state_entry(parser, m)) is not None:
                    self.states.setdefault(partition, []).append(change)


def fold_logs(start_offsets: dict[int, int], parsed: ParsedLogs,
              layout: SlotLayout | None = None) -> dict[int, RestoredPartition]:
    """The restored slots from the records read (see the module docstring for the rules). Input
    records at or past a committed offset and outputs of offsets before it are ignored, so the logs
    may hold more than a plan asked for, from earlier offsets or up to a later end; a record of
    another slot of the same partition is ignored too."""
    layout = layout or SlotLayout.whole_partitions(start_offsets)
    router = SlotRouter(layout)
    result = {s: RestoredPartition(o) for s, o in start_offsets.items()}
    paced = parsed.pacer.paced
    for s, restored in result.items():
        p = layout.partition_of(s)
        for entry in paced(parsed.inputs.get(p, [])):
            if entry.offset >= restored.start_offset:
                break  # offsets ascend within a partition
            if entry.uuid is not None and router.slot_of(p, entry.key) == s:
                restored.seen.append((entry.uuid, entry.event_s))

    # (offset, clientId, state or None) from the processed records of offsets >= C, per slot.
    states_after: dict[int, list[tuple[int, ClientId, Any]]] = {s: [] for s in result}
    for out in paced(parsed.outputs):
        # An output of an event at or past the committed offset: it must not run again, its uuid
        # joins the window, and the client's state after it (if its handler changed it) is noted.
        if not 0 <= out.partition < layout.partitions:
            continue
        slot = router.slot_of(out.partition, out.key)
        target = result.get(slot)
        if target is None or out.offset < target.start_offset:
            continue
        # Not added to the window here: the old owner saw these events in log order, each with the
        # stream time at its place; an event finished far ahead (a slow client held the committed
        # offset back) must not move the window's clock past a duplicate the new owner will fetch
        # before it. The intake adds each when the fetch passes it.
        target.finished_offsets[out.offset] = Finished(out.outcome, out.uuid, out.created_s)
        if out.state is not None:
            states_after[slot].append((out.offset, *out.state))

    for s, restored in result.items():
        p = layout.partition_of(s)
        key = slot_totals_key(layout, s)
        # The newest totals the committed offset covers; a newer record counting past it was
        # written by a transaction whose offsets did not commit (tansu workaround: torn on tansu;
        # Kafka never shows one): its offsets run again and are counted again.
        totals = [record for record in parsed.totals.get(p, []) if record.key == key]
        for record in totals:
            if record.counted_to <= restored.start_offset:
                restored.totals, restored.snapshot_start = record.totals, record.snapshot_start
                restored.counted_to = record.counted_to
        changes = [c for c in parsed.states.get(p, []) if router.slot_of(p, str(c.client).encode()) == s]
        restored.changelog_records = len(changes) + len(totals)
        newest: dict[ClientId, int] = {}  # per client, the source offset folded last (-1: no header)
        for change in changes:
            source = -1 if change.source_offset is None else change.source_offset
            if source >= restored.start_offset:
                continue  # possibly ahead of its processed record: that record carries the state
            if source < newest.get(change.client, -1):
                continue  # a fenced owner's record that landed late (tansu): an older state
            newest[change.client] = source
            _set_state(restored, change.client, change.state, change.source_offset)
        for offset, client, state in sorted(states_after[s], key=lambda entry: entry[0]):
            _set_state(restored, client, state, offset)
            restored.from_outputs[client] = offset
    return result


def describe_restore(settings: WorkerSettings, restored: Mapping[int, RestoredPartition], parsed: ParsedLogs,
                     layout: SlotLayout, read_ahead_from: Mapping[int, int] | None = None) -> str:
    """One line saying what a restore restored each slot from: where it resumes (C; C0 when it went
    on from a read-ahead), the totals record it took, the changelog records and states it folded,
    the offsets at or past C that had finished (outputs found) and the states it re-logs from their
    processed records; then the offsets of every span it read (first-after last record)."""
    slots = []
    for s, r in sorted(restored.items()):
        ahead = f" (read ahead from {read_ahead_from[s]})" if read_ahead_from and s in read_ahead_from else ""
        finished = sorted(r.finished_offsets)
        done = f"{len(finished)} finished at or past it ({finished[0]}-{finished[-1]})" if finished else "none past it"
        relog = sorted(r.from_outputs.values())
        relogged = f", re-logging {len(relog)} states set at {relog[0]}-{relog[-1]}" if relog else ""
        slots.append(f"{layout.describe_slot(s)} from {r.start_offset}{ahead}: totals counting to {r.counted_to}, "
                     f"{r.changelog_records} changelog records, {len(r.state)} client states, {len(r.seen)} uuids, "
                     f"{done}{relogged}")
    roles = {settings.topic: "input", settings.sink: "sink", settings.dlq: "dlq", settings.state: "changelog"}
    spans = ", ".join(f"{roles.get(t, t)}[{p}] {a}-{b}" for (t, p), (a, b) in sorted(parsed.read.items()))
    return f"{'; '.join(slots)}; read {spans or 'nothing'}"


def _input_entry(parser: InputParser, m: Message) -> InputEntry:
    # Every fetched record has an offset (the stubs say Optional).
    offset: int = m.offset()  # type: ignore[assignment]
    timestamp_ms = m.timestamp()[1]
    try:
        # The intake's own mapping, so the window holds what the intake would have put there.
        event = parser.parse(m.key(), m.value(), m.headers(), timestamp_ms)
    except BadEvent:
        return InputEntry(offset, timestamp_ms, None, 0.0, m.key())
    event_ms = event.created_ms or timestamp_ms  # as the engine does when `created` is missing
    return InputEntry(offset, timestamp_ms, event.uuid, event_ms / 1000, m.key())


def _processed_entry(m: Message) -> OutputEntry | None:
    value = m.value()
    if value is None:
        return None
    record = decode_processed(value)
    encoded = _header(m, STATE_HEADER)
    state = None if encoded is None else (record["clientId"], orjson.loads(encoded))
    # Without `created` the event's time is its input record's, which the fetch gives (slot.py), not this one's.
    created_s = (record.get("created") or 0) / 1000
    return OutputEntry(record["partition"], record["offset"], record["uuid"], created_s, state, Outcome.HANDLED,
                       str(record["clientId"]).encode())


def _dead_letter_entry(parser: InputParser, m: Message) -> OutputEntry | None:
    record_headers = m.headers()
    headers = dict(record_headers or [])
    try:
        partition = int(headers[DLQ_PARTITION] or b"")
        offset = int(headers[DLQ_OFFSET] or b"")
    except (KeyError, ValueError):
        return None
    # A dead letter keeps its record's key, value and (with a mapping that reads them) headers and
    # timestamp (inputmapping.source_timestamp), so the mapping finds the event's uuid in it; a
    # truncated one keeps the event's identity instead, whatever the mapping. Its own timestamp is
    # when it was written, never the event's: without a kept one, 0 (the fetch gives it: slot.py).
    timestamp_ms = source_timestamp(headers, 0)
    try:
        if DLQ_TRUNCATED in headers:
            event = decode_identity(m.value())
        else:
            event = parser.parse(m.key(), m.value(), record_headers, timestamp_ms)
        return OutputEntry(partition, offset, event.uuid, event.created_ms / 1000, None, Outcome.DEAD_LETTERED,
                           m.key())
    except BadEvent:
        return OutputEntry(partition, offset, None, 0.0, None, Outcome.DEAD_LETTERED, m.key())


def _state_entry(parser: InputParser, m: Message) -> StateEntry | None:
    key = m.key()
    if key is None:
        return None
    source = _header(m, SOURCE_OFFSET_HEADER)
    value = m.value()
    return StateEntry(parser.mapping.client_of_key(key), None if source is None else int(source),
                      None if value is None else orjson.loads(value))


def _totals_entry(m: Message) -> TotalsEntry | None:
    named = snapshot_named(m)
    value = m.value()
    if named is None or value is None:
        return None
    return TotalsEntry(named[0], Totals(*decode_totals(value)), named[1], m.key() or b"")


def _set_state(restored: RestoredPartition, client: ClientId, state: Any, offset: int | None) -> None:
    if state is None:
        restored.state.pop(client, None)
        restored.state_offsets.pop(client, None)
        return
    restored.state[client] = state
    if offset is None:
        restored.state_offsets.pop(client, None)
    else:
        restored.state_offsets[client] = offset


def _header(m: Message, name: str) -> bytes | None:
    value = dict(m.headers() or []).get(name)
    return value if isinstance(value, bytes) else None
