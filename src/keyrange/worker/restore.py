"""Rebuilding a partition's dedup window, finished offsets and keyed state from the logs.

On acquire (and on start) nothing is trusted from memory. For each input partition, with C its
committed offset:
- the input before C, from TTL (plus clock slack) before the event time there, gives the uuids
  the window must hold (everything below C is finished); the window is in event time (see
  dedup.py), so it is rebuilt exactly;
- the sink and dead-letter records of offsets >= C are events that finished after the last
  commit (outputs commit in the same transaction as offsets, and events finish out of order):
  they are skipped, not run again, and their uuids join the window;
- keyed state: the changelog entries (`<group>.state`) whose source offset (header
  `keyrange.source.offset`) is < C are folded in log order, entries >= C are ignored; then the
  state headers (`keyrange.state`) of the processed records of offsets >= C (exactly the events
  marked finished above) are applied in offset order.
Everything here is blocking and runs on a thread of its own.

Why the state is right whatever prefix of a transaction became visible. The state a client must
resume with is the one after its last finished event. Events finished after the snapshot that
chose C all have offsets >= C (C was the lowest unfinished offset), so every changelog entry a
transaction without committed offsets wrote is >= C and ignored; the state of each finished
event >= C comes from its own processed record, which is one record and cannot be torn from it.
A client's processed records sit in its partition in offset order (its events run one at a
time), so the visible ones are a prefix of its events, and the first one missing runs again on
the state after the last one visible. Entries < C were written in transactions whose offsets
committed, so they are complete (the producer flushes every output before sending offsets; see
transactions.py). This matters on tansu, whose init_transactions commits what a killed
predecessor left open instead of aborting it, so a partition can hold a prefix of that
transaction's records and the changelog an independent prefix of its state records.
On real Kafka it is the same state the plain changelog gives: entries >= C committed atomically
with processed records carrying the same state (an entry coalesces a client's changes of one
transaction and carries the offset of the last one, whose processed record holds that state);
and compaction can drop an entry < C only in favour of a newer one of the same client, which
is either < C itself or >= C, whose processed record then carries the state.
Changelog records written before the offset header existed are treated as < C.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from keyrange.errors import UserError
from keyrange.events import DLQ_OFFSET, DLQ_PARTITION, BadEvent, decode_processed, parse_input
from keyrange.worker.consumer import consumer_config
from keyrange.worker.settings import WorkerSettings

POLL_SECONDS = 0.01
"""How long a read waits for a record when nothing is buffered; bounds how late it sees its end."""
FETCH_WAIT_MS = 5
"""How long the broker may hold a fetch at a log's end: every read ends with one such fetch."""
READ_BATCH = 5000
"""Records taken from the consumer's buffer in one call."""

SOURCE_OFFSET_HEADER = "keyrange.source.offset"
"""Header of a changelog record: the input offset of the event whose handler wrote the state."""
STATE_HEADER = "keyrange.state"
"""Header of a processed record whose handler changed the client's state: the state after the
event, as JSON; `null` means deleted (a stored state is never null: `set(None)` deletes)."""

Span = tuple[str, int]
"""(topic, partition)."""


class RestoreError(UserError, RuntimeError):
    """A log could not be read to its end in time, so restoring would risk re-running events."""


@dataclass
class RestoredPartition:
    """What a worker needs to take over one partition."""

    start_offset: int
    """Where fetching resumes: the committed offset, or the first offset when none is committed."""
    finished_offsets: set[int] = field(default_factory=set)
    """Offsets >= start_offset already handled or dead-lettered: skip them."""
    seen: list[tuple[str, float]] = field(default_factory=list)
    """(uuid, event time in seconds) of the events the dedup window must hold, oldest first."""
    state: dict[int, Any] = field(default_factory=dict)
    """Keyed state per clientId."""


class _Reader:
    """The one consumer every read of a restore goes through.

    A consumer per read cost a connection and metadata round trip each; reads of several topics
    and partitions share one assignment, so they fetch in parallel.
    """

    def __init__(self, settings: WorkerSettings) -> None:
        self._settings = settings
        # The worker's own group id, to look up its committed offsets; this consumer only ever
        # assigns, so it never joins the group or commits.
        self._consumer = Consumer(consumer_config(settings, **{"fetch.wait.max.ms": FETCH_WAIT_MS}))
        self._known_topics: set[str] = set()

    def connect(self, topics: Iterable[str]) -> None:
        """Connect and fetch the topics' metadata now, so a later read does not wait for either."""
        self._learn_topics(set(topics))

    def _learn_topics(self, topics: set[str]) -> None:
        for topic in topics - self._known_topics:
            # Otherwise a topic this consumer has no metadata for waits for the next periodic
            # refresh (about 1 s) before its first fetch.
            self._consumer.list_topics(topic, timeout=self._settings.kafka_timeout_seconds)
            self._known_topics.add(topic)

    def start_offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """Where each partition resumes: the group's committed offset, or the first offset when none."""
        timeout = self._settings.kafka_timeout_seconds
        found = self._consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout)
        starts = {tp.partition: tp.offset for tp in found}
        for p, offset in starts.items():
            if offset < 0:
                starts[p] = self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[0]
        return starts

    def close(self) -> None:
        """Close the consumer (it never joined a group)."""
        self._consumer.close()

    def read(self, starts: dict[Span, int], stops: dict[Span, int] | None = None
             ) -> tuple[dict[Span, list[Message]], dict[Span, int]]:
        """Records from `starts` up to `stops` (exclusive; a span without a stop: to the end), per
        span in log order; and the offset each span was read to.

        "The end" is the high watermark seen in fetch responses (tansu's ListOffsets answer can be
        too low, ENVIRONMENT.md bug 1); positions move past transaction markers, so a span is
        done when its position reaches it. The consumer keeps a partition's last high watermark
        after it is unassigned, so a span read to the end must not have been read before by this
        reader (a span with a stop may: the stop bounds it).
        """
        stops = stops or {}
        out: dict[Span, list[Message]] = {span: [] for span in starts}
        ends: dict[Span, int] = {}
        wanted = {}
        for start_span, start in starts.items():
            if start_span in stops and start >= stops[start_span]:
                ends[start_span] = start
            else:
                wanted[start_span] = start
        if not wanted:
            return out, ends
        consumer = self._consumer
        self._learn_topics({t for t, _ in wanted})
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in wanted.items()])
        try:
            last: dict[Span, int] = {}
            timeout = self._settings.kafka_timeout_seconds
            deadline = time.monotonic() + timeout
            while wanted:
                if time.monotonic() > deadline:
                    raise RestoreError(
                        f"could not read {sorted(wanted)} (topic, partition) to the end within {timeout:g} s "
                        "(an open transaction of a crashed worker holds it back until it times out); "
                        "retry, or raise the Kafka timeout"
                    )
                # Take what is buffered; wait briefly only when nothing is (a batch consume waits
                # for a full batch or the timeout, which would add the timeout to every read).
                messages = consumer.consume(READ_BATCH, 0) or consumer.consume(1, POLL_SECONDS)
                for m in messages:
                    if m.error() is not None:
                        continue
                    # Every fetched record has a topic, partition and offset (the stubs say Optional).
                    span: Span = (m.topic(), m.partition())  # type: ignore[assignment]
                    offset: int = m.offset()  # type: ignore[assignment]
                    if span not in wanted or offset >= stops.get(span, offset + 1):
                        continue
                    last[span] = offset
                    out[span].append(m)
                done = []
                for span in wanted:
                    tp = TopicPartition(*span)
                    position = consumer.position([tp])[0].offset
                    reached = max(position, last.get(span, -1) + 1, wanted[span])
                    high = consumer.get_watermark_offsets(tp, cached=True)[1]
                    stop = stops.get(span)
                    end = high if stop is None else (min(stop, high) if high >= 0 else stop)
                    if end >= 0 and reached >= end:
                        done.append(tp)
                        ends[span] = end
                if done:
                    for tp in done:
                        del wanted[(tp.topic, tp.partition)]
                    consumer.incremental_unassign(done)
            return out, ends
        finally:
            consumer.unassign()

    def offsets_at(self, times_ms: dict[Span, int]) -> dict[Span, int]:
        """First offset at or after the given time, per span, or the end when there is none."""
        if not times_ms:
            return {}
        timeout = self._settings.kafka_timeout_seconds
        found = self._consumer.offsets_for_times(
            [TopicPartition(t, p, ms) for (t, p), ms in times_ms.items()], timeout=timeout)
        out = {}
        for tp in found:
            # tansu matches broker append time and answers 0 for a future time (bug 2): both only
            # make the read longer, never skip records.
            out[(tp.topic, tp.partition)] = (
                tp.offset if tp.offset >= 0 else self._consumer.get_watermark_offsets(tp, timeout=timeout)[1])
        return out


def restore(settings: WorkerSettings, start_offsets: dict[int, int], partition_counts: dict[str, int],
            now_s: float | None = None) -> dict[int, RestoredPartition]:
    """Restore every partition in `start_offsets` (partition -> committed or first offset).

    Three round trips on one consumer: the record at each committed offset; the offsets at the
    window's and the outputs' start times; then the input window, the sink, the dead letters and
    the changelog, all in one assignment.
    """
    reader = _Reader(settings)
    try:
        return _restore(reader, settings, start_offsets, partition_counts, now_s)
    finally:
        reader.close()


class Restorer:
    """Restores slots for one worker, with a connected reader always ready for the next acquire.

    A handoff's moved slots pause for as long as the new owner's acquire takes, and a fresh
    consumer spends tens of milliseconds connecting and fetching metadata before its first read.
    So the reader for the next restore connects in the background as soon as the previous one is
    used up. Each reader serves one restore only: a consumer keeps a partition's last high
    watermark after unassigning it, and `_Reader.read` must not mistake that for the end.
    """

    def __init__(self, settings: WorkerSettings, partition_counts: dict[str, int]) -> None:
        self._settings = settings
        self._counts = dict(partition_counts)
        self._topics = list(partition_counts)
        self._lock = threading.Lock()
        self._ready: Future[_Reader] | None = None
        self._closed = False

    def prepare(self) -> None:
        """Start connecting the next reader (idempotent)."""
        with self._lock:
            if self._ready is None and not self._closed:
                self._ready = Future()
                threading.Thread(target=self._connect, args=(self._ready,), name="keyrange-restore-warmup",
                                 daemon=True).start()

    def _connect(self, ready: Future[_Reader]) -> None:
        try:
            reader = _Reader(self._settings)
            try:
                reader.connect(self._topics)
            except Exception:
                reader.close()
                raise
            ready.set_result(reader)
        except Exception as exc:  # noqa: BLE001 - handed to the restore that takes this reader
            ready.set_exception(exc)

    def _take(self) -> _Reader:
        self.prepare()
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None:  # closed
            raise RuntimeError("restorer is closed")
        try:
            return ready.result(timeout=self._settings.kafka_timeout_seconds)
        except KafkaException:
            return _Reader(self._settings)  # the warm-up failed (broker away then): try afresh

    def restore_slots(self, slots: Iterable[int], now_s: float | None = None) -> dict[int, RestoredPartition]:
        """Look up where each slot resumes (committed offset, else the first), then restore it.
        Blocking: run it on a thread."""
        reader = self._take()
        try:
            starts = reader.start_offsets(self._settings.topic, sorted(set(slots)))
            return _restore(reader, self._settings, starts, self._counts, now_s)
        finally:
            # Closing takes tens of milliseconds the acquire need not wait for.
            threading.Thread(target=reader.close, name="keyrange-restore-close", daemon=True).start()
            self.prepare()

    def close(self) -> None:
        """Close the ready reader, if any; no reader is prepared after this."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, None
        if ready is not None:
            with contextlib.suppress(Exception):
                ready.result(timeout=self._settings.kafka_timeout_seconds).close()


def _restore(reader: _Reader, settings: WorkerSettings, start_offsets: dict[int, int],
             partition_counts: dict[str, int], now_s: float | None) -> dict[int, RestoredPartition]:
    now_s = time.time() if now_s is None else now_s
    result = {p: RestoredPartition(o) for p, o in start_offsets.items()}
    slack_ms = int(settings.restore_clock_slack_seconds * 1000)
    parts = list(start_offsets)
    topic = settings.topic

    # The event time at the committed offset: where the window's stream time stood (under lag it
    # can be far behind now), and a lower bound of when outputs past the offset were written.
    first_unfinished, ends = reader.read({(topic, p): o for p, o in start_offsets.items()},
                                         {(topic, p): o + 1 for p, o in start_offsets.items()})
    resume_ms = {p: int(now_s * 1000) for p in parts}
    for (_, p), messages in first_unfinished.items():
        for m in messages:
            resume_ms[p] = min(resume_ms[p], m.timestamp()[1])
    # A partition that ends at its committed offset has no event at or past it, so no output of
    # one to find (a transaction marker at the offset does not count: records may follow it).
    ended = {p for p in parts if ends[(topic, p)] <= start_offsets[p]}

    ttl_ms = int(settings.ttl_seconds * 1000)
    times = {(topic, p): resume_ms[p] - ttl_ms - slack_ms for p in parts if start_offsets[p] > 0}
    outputs_from_ms = min(resume_ms.values(), default=int(now_s * 1000)) - slack_ms
    input_count = partition_counts[topic]
    for out_topic in (settings.sink, settings.dlq):
        if partition_counts[out_topic] == input_count:
            times.update({(out_topic, p): outputs_from_ms for p in parts if p not in ended})
        elif not ended.issuperset(parts):
            times.update({(out_topic, p): outputs_from_ms for p in range(partition_counts[out_topic])})
    offsets = reader.offsets_at(times)

    # Input just before the committed offsets (the uuids the dedup window holds there), the outputs
    # of offsets >= C, and the changelog from its start.
    starts = dict(offsets)
    starts.update({(settings.state, p): 0 for p in parts})
    logs, _ = reader.read(starts, {(topic, p): start_offsets[p] for p in parts if (topic, p) in starts})

    for p in parts:
        for m in logs.get((topic, p), []):
            try:
                event = parse_input(m.value())
            except BadEvent:
                continue
            event_ms = event.created_ms or m.timestamp()[1]  # as the engine does when `created` is missing
            result[p].seen.append((event.uuid, event_ms / 1000))

    # (offset, clientId, state or None) from the processed records of offsets >= C, per partition.
    states_after: dict[int, list[tuple[int, int, Any]]] = {p: [] for p in parts}
    for out_topic in (settings.sink, settings.dlq):
        for (t, _), messages in logs.items():
            if t == out_topic:
                for m in messages:
                    _note_finished(result, states_after, out_topic == settings.dlq, m)

    for p in parts:
        restored = result[p]
        for m in logs[(settings.state, p)]:
            key = m.key()
            if key is None:
                continue
            source = _header(m, SOURCE_OFFSET_HEADER)
            if source is not None and int(source) >= restored.start_offset:
                continue  # possibly ahead of its processed record: that record carries the state
            value = m.value()
            _set_state(restored.state, int(key), None if value is None else orjson.loads(value))
    for p, r in result.items():
        r.seen.sort(key=lambda pair: pair[1])
        for _, client, state in sorted(states_after[p], key=lambda entry: entry[0]):
            _set_state(r.state, client, state)
    return result


def _set_state(states: dict[int, Any], client: int, state: Any) -> None:
    if state is None:
        states.pop(client, None)
    else:
        states[client] = state


def _header(m: Message, name: str) -> bytes | None:
    value = dict(m.headers() or []).get(name)
    return value if isinstance(value, bytes) else None


def _note_finished(result: dict[int, RestoredPartition], states_after: dict[int, list[tuple[int, int, Any]]],
                   dead_letter: bool, m: Message) -> None:
    """Record an output (processed record or dead letter) of an event at or past the committed
    offset: it must not run again, its uuid joins the window, and the client's state after it
    (if its handler changed it) is noted."""
    value = m.value()
    state: tuple[int, Any] | None = None
    if dead_letter:
        headers = dict(m.headers() or [])
        try:
            partition = int(headers[DLQ_PARTITION] or b"")
            offset = int(headers[DLQ_OFFSET] or b"")
        except (KeyError, ValueError):
            return
        try:
            event = parse_input(value)
            uuid: str | None = event.uuid
            created_s = (event.created_ms or m.timestamp()[1]) / 1000
        except BadEvent:
            uuid, created_s = None, 0.0
    else:
        if value is None:
            return
        record = decode_processed(value)
        partition, offset, uuid = record["partition"], record["offset"], record["uuid"]
        created_s = (record.get("created") or m.timestamp()[1]) / 1000
        encoded = _header(m, STATE_HEADER)
        if encoded is not None:
            state = (record["clientId"], orjson.loads(encoded))
    restored = result.get(partition)
    if restored is None or offset < restored.start_offset:
        return
    restored.finished_offsets.add(offset)
    if state is not None:
        states_after[partition].append((offset, *state))
    if uuid is not None:
        restored.seen.append((uuid, created_s))
