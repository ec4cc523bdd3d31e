"""Rebuilding a partition's dedup window, finished offsets and keyed state from the logs.

On acquire (and on start) nothing is trusted from memory. For each input partition:
- the input before the committed offset, from TTL (plus clock slack) before the event time
  there, gives the uuids the window must hold (everything below the committed offset is
  finished); the window is in event time (see dedup.py), so it is rebuilt exactly;
- the sink and dead-letter records of offsets at or above the committed offset are events that
  finished after the last commit (outputs commit in the same transaction as offsets, and events
  finish out of order): they are skipped, not run again, and their uuids join the window;
- the compacted state changelog, read to its end, gives each client's latest state.
Everything here is blocking and runs on a thread of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Consumer, Message, TopicPartition

from keyrange.errors import UserError
from keyrange.events import DLQ_OFFSET, DLQ_PARTITION, BadEvent, decode_processed, parse_input
from keyrange.worker.consumer import consumer_config
from keyrange.worker.settings import WorkerSettings

POLL_SECONDS = 0.1


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


def _read(settings: WorkerSettings, topic: str, starts: dict[int, int],
          stops: dict[int, int] | None = None) -> list[Message]:
    """Records of `topic` from `starts` per partition up to `stops` (exclusive) or to the end.

    "The end" is the high watermark seen in fetch responses (tansu's ListOffsets answer can be
    too low, ENVIRONMENT.md bug 1); positions move past transaction markers, so a partition is
    done when its position reaches it.
    """
    wanted = {p: o for p, o in starts.items() if stops is None or o < stops[p]}
    if not wanted:
        return []
    consumer = Consumer(consumer_config(settings, **{"group.id": f"{settings.group_id}.restore"}))
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in wanted.items()])
        out: list[Message] = []
        last: dict[int, int] = {}
        deadline = time.monotonic() + settings.kafka_timeout_seconds
        while wanted:
            if time.monotonic() > deadline:
                raise RestoreError(
                    f"could not read topic {topic!r} partitions {sorted(wanted)} to the end within "
                    f"{settings.kafka_timeout_seconds:g} s (an open transaction of a crashed worker "
                    "holds it back until it times out); retry, or raise the Kafka timeout"
                )
            for m in consumer.consume(1000, POLL_SECONDS):
                if m.error() is not None:
                    continue
                # Every fetched record has a partition and an offset (the stubs say Optional).
                p: int = m.partition()  # type: ignore[assignment]
                offset: int = m.offset()  # type: ignore[assignment]
                if stops is not None and offset >= stops[p]:
                    continue
                last[p] = offset
                out.append(m)
            for p in list(wanted):
                tp = TopicPartition(topic, p)
                position = consumer.position([tp])[0].offset
                reached = max(position, last.get(p, -1) + 1, wanted[p])
                high = consumer.get_watermark_offsets(tp, cached=True)[1]
                end = high if stops is None else (min(stops[p], high) if high >= 0 else stops[p])
                if end >= 0 and reached >= end:
                    del wanted[p]
                    consumer.incremental_unassign([tp])
        return out
    finally:
        consumer.close()


def _offsets_at(settings: WorkerSettings, topic: str, times_ms: dict[int, int]) -> dict[int, int]:
    """First offset at or after the given time, per partition, or the end when there is none."""
    consumer = Consumer(consumer_config(settings, **{"group.id": f"{settings.group_id}.restore"}))
    try:
        timeout = settings.kafka_timeout_seconds
        found = consumer.offsets_for_times([TopicPartition(topic, p, t) for p, t in times_ms.items()],
                                           timeout=timeout)
        out = {}
        for tp in found:
            # tansu matches broker append time and answers 0 for a future time (bug 2): both only
            # make the read longer, never skip records.
            out[tp.partition] = tp.offset if tp.offset >= 0 else consumer.get_watermark_offsets(tp, timeout=timeout)[1]
        return out
    finally:
        consumer.close()


def restore(settings: WorkerSettings, start_offsets: dict[int, int], partition_counts: dict[str, int],
            now_s: float | None = None) -> dict[int, RestoredPartition]:
    """Restore every partition in `start_offsets` (partition -> committed or first offset)."""
    now_s = time.time() if now_s is None else now_s
    result = {p: RestoredPartition(o) for p, o in start_offsets.items()}
    slack_ms = int(settings.restore_clock_slack_seconds * 1000)
    parts = list(start_offsets)

    # The event time at the committed offset: where the window's stream time stood (under lag it
    # can be far behind now), and a lower bound of when outputs past the offset were written.
    first_unfinished = _read(settings, settings.topic, start_offsets,
                             {p: o + 1 for p, o in start_offsets.items()})
    resume_ms = {p: int(now_s * 1000) for p in parts}
    for m in first_unfinished:
        resume_ms[m.partition()] = min(resume_ms[m.partition()], m.timestamp()[1])  # type: ignore[index]

    # Input just before the committed offsets: the uuids the dedup window holds there.
    ttl_ms = int(settings.ttl_seconds * 1000)
    window_from = _offsets_at(settings, settings.topic, {p: resume_ms[p] - ttl_ms - slack_ms for p in parts})
    for m in _read(settings, settings.topic, window_from, start_offsets):
        try:
            event = parse_input(m.value())
        except BadEvent:
            continue
        event_ms = event.created_ms or m.timestamp()[1]  # as the engine does when `created` is missing
        result[m.partition()].seen.append((event.uuid, event_ms / 1000))  # type: ignore[index]

    outputs_from_ms = min(resume_ms.values(), default=int(now_s * 1000)) - slack_ms
    input_count = partition_counts[settings.topic]
    for topic in (settings.sink, settings.dlq):
        same_layout = partition_counts[topic] == input_count
        out_parts = parts if same_layout else list(range(partition_counts[topic]))
        for m in _read(settings, topic, _offsets_at(settings, topic, dict.fromkeys(out_parts, outputs_from_ms))):
            _note_finished(result, topic == settings.dlq, m)

    changelog_starts = {p: 0 for p in parts}
    for m in _read(settings, settings.state, changelog_starts):
        key = m.key()
        if key is None:
            continue
        client = int(key)
        value = m.value()
        restored = result[m.partition()]  # type: ignore[index]
        if value is None:
            restored.state.pop(client, None)
        else:
            restored.state[client] = orjson.loads(value)
    for r in result.values():
        r.seen.sort(key=lambda pair: pair[1])
    return result


def _note_finished(result: dict[int, RestoredPartition], dead_letter: bool, m: Message) -> None:
    """Record an output (processed record or dead letter) of an event at or past the committed
    offset: it must not run again, and its uuid joins the window."""
    value = m.value()
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
    restored = result.get(partition)
    if restored is None or offset < restored.start_offset:
        return
    restored.finished_offsets.add(offset)
    if uuid is not None:
        restored.seen.append((uuid, created_s))
