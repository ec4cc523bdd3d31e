"""Test helpers that read topics back from the broker."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from keyrange.events import decode_processed
from keyrange.inputmapping import InputMapping
from keyrange.kafkaclients import KafkaClients
from keyrange.logend import spans_behind
from tests.checkers import Counts, LoggedEvent
from tests.kafkaretry import retrying


def flush_while_delivering(producer: Producer, stalled_seconds: float = 60.0) -> int:
    """Flush `producer`, waiting as long as records keep being delivered; return how many are left
    after `stalled_seconds` without one delivered (a setup that writes tens of thousands of one-record
    batches takes minutes on a starved machine, and is not what its test measures)."""
    left = len(producer)
    while left:
        now_left = producer.flush(stalled_seconds)
        if now_left >= left:
            return now_left
        left = now_left
    return 0


def read_topic(bootstrap: str, topic: str, expect: int | None = None,
               timeout_seconds: float = 60.0) -> list[Any]:
    """Every record of `topic` from the beginning to its end (read_committed), as confluent Messages.

    The end is keyrange's one rule for reads to the end (keyrange/logend.py: the fetch responses'
    high watermark, reached by the position). `expect` is how many records to wait
    for while the log is still being written, never a place to stop early: an event handled twice
    must not stay unread behind it. A read that has not reached the end after `timeout_seconds`
    returns what it read if the log was read to its end but is shorter (the caller's checks say
    what is missing), or if it holds `expect` records while an open transaction keeps
    read_committed reads from the end (writers are still at work); otherwise it fails, naming the
    partitions held back.
    """
    consumer = Consumer(KafkaClients(bootstrap).consumer(f"test-reader-{time.monotonic_ns()}"))
    try:
        deadline = time.monotonic() + timeout_seconds
        parts = _partitions_once_created(consumer, topic, deadline)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        next_offset = {(topic, p): 0 for p in parts}
        while True:
            for m in consumer.consume(1000, 0.1):
                if m.error() is None:
                    out.append(m)
                    next_offset[(topic, m.partition())] = m.offset() + 1
            behind = {p: at_end for (_, p), at_end in spans_behind(consumer, next_offset).items()}
            if not behind and (expect is None or len(out) >= expect):
                return out
            if time.monotonic() > deadline:
                if not behind or (expect is not None and len(out) >= expect):
                    return out
                raise AssertionError(
                    f"{topic}: partitions not read to their end in {timeout_seconds:g} s, as "
                    f"{{partition: (read to, high watermark)}}: {behind} ({len(out)} records read)")
    finally:
        consumer.close()


def _partitions_once_created(consumer: Consumer, topic: str, deadline: float) -> list[int]:
    """The partitions of `topic`, waiting until `deadline` for it to exist: a worker creates its
    processed topic when it starts, which on a busy machine can come after the read begins."""
    while True:
        found = retrying(lambda: consumer.list_topics(topic, timeout=10)).topics.get(topic)
        if found is not None and found.partitions:
            return sorted(found.partitions)
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: the topic does not exist (did any worker start and write to it?)")
        time.sleep(0.2)


def read_input_log(bootstrap: str, topic: str, expect: int | None = None,
                   mapping: InputMapping | None = None) -> list[LoggedEvent]:
    """The input topic as LoggedEvents (partition, offset, clientId, uuid, body); with `mapping`,
    each record as that input mapping (spec.input) reads it."""
    import orjson

    events = []
    for m in read_topic(bootstrap, topic, expect):
        if mapping is None:
            body = orjson.loads(m.value())
            events.append(LoggedEvent(m.partition(), m.offset(), body["clientId"], body["uuid"], body))
            continue
        event = mapping.parser.parse(m.key(), m.value(), m.headers(), m.timestamp()[1])
        assert event.uuid is not None, "the checkers need event ids: a mapping with uuid: none has none"
        events.append(LoggedEvent(m.partition(), m.offset(), event.client_id, event.uuid, event.body))
    return events


def read_processed(bootstrap: str, topic: str, expect: int | None = None,
                   timeout_seconds: float = 60.0) -> list[Mapping[str, Any]]:
    """The processed records of a sink topic, decoded."""
    return [decode_processed(m.value()) for m in read_topic(bootstrap, topic, expect,
                                                            timeout_seconds=timeout_seconds)]


def log_ends(log: Iterable[LoggedEvent], partitions: Iterable[int] = ()) -> dict[int, int]:
    """{partition: the offset after its last event in `log`}, 0 for a listed partition with none."""
    ends = dict.fromkeys(partitions, 0)
    for e in log:
        ends[e.partition] = max(ends.get(e.partition, 0), e.offset + 1)
    return ends


def committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """The group's committed offset of every partition of `topic` (its first offset when none)."""
    from keyrange.kafkaio import partition_counts
    from keyrange.worker import WorkerSettings
    from keyrange.worker.logreader import LogReader

    reader = LogReader(WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=group))
    try:
        parts = range(retrying(lambda: partition_counts(bootstrap))[topic])
        return retrying(lambda: reader.start_offsets(topic, parts))
    finally:
        reader.close()


def offsets_committed_so_far(bootstrap: str, topic: str, group: str, partitions: Iterable[int]) -> dict[int, int]:
    """The group's committed offset of each partition as it stands (-1001 where none), for watching
    workers from outside.

    Offsets a worker sent to a transaction it has not committed are not waited for: a read_committed
    consumer's fetch would wait for them to settle (KIP-447 "require stable"), which a worker frozen
    in that window puts off until the transaction times out. A read_uncommitted fetch does not ask
    for that, and still returns committed offsets only.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_uncommitted",
                         "log_level": 3})
    try:
        wanted = [TopicPartition(topic, p) for p in partitions]
        found = retrying(lambda: consumer.committed(wanted, timeout=10))
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def read_counts(bootstrap: str, topic: str, group: str, covering: int = 0,
                timeout_seconds: float = 60.0) -> Counts:
    """The group's committed totals over every partition of `topic` (worker/totals.py): exact
    across handoffs, crashes and restarts. With `covering`, waits until the committed offsets
    cover that many input records (a last transaction may still be on its way). A read that times
    out (a broker restarting) is tried again (tests/kafkaretry.py), even with `timeout_seconds=0`."""
    from keyrange.kafkaio import partition_counts
    from keyrange.ranges.layout import SlotLayout
    from keyrange.worker import WorkerSettings
    from keyrange.worker.totals import committed_totals, sum_totals

    settings = WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=group)
    counts = retrying(lambda: partition_counts(bootstrap))
    parts = range(counts[topic])
    slot_count = control_slot_count(bootstrap, group) if f"{group}.control" in counts else None
    layout = SlotLayout.of_slot_count(len(parts), slot_count) if slot_count else None
    deadline = time.monotonic() + timeout_seconds
    while True:
        total = sum_totals(retrying(lambda: committed_totals(settings, parts, layout)).values())
        covered = total.handled + total.dead_lettered + total.duplicates_dropped
        if covered >= covering or time.monotonic() > deadline:
            return Counts(total.handled, total.dead_lettered, total.duplicates_dropped)
        time.sleep(0.2)


def committed_input_records(bootstrap: str, topic: str, group: str) -> int:
    """How many input records of `topic` the group's committed totals account for so far (handled,
    dead-lettered or dropped as a duplicate: each committed input record is exactly one of them),
    for waiting until the workers have committed some work, or everything sent before a moment."""
    counts = read_counts(bootstrap, topic, group, timeout_seconds=0)
    return counts.handled + counts.dead_lettered + counts.duplicates_dropped


def control_slot_count(bootstrap: str, group: str) -> int | None:
    """The slot count of the newest range map on the consumer's control topic (None: no map), which
    says how its partitions are cut into slots (ranges/layout.py)."""
    from keyrange.ranges.channel import ASSIGNMENT_KEY, Publication, control_topic

    slot_count = None
    for m in read_topic(bootstrap, control_topic(group)):
        if m.key() == ASSIGNMENT_KEY and m.value() is not None:
            slot_count = Publication.decode(m.value()).map.slot_count
    return slot_count


def dump_topics(bootstrap: str, topics: Iterable[str], dest: Path, timeout_seconds: float = 60.0) -> None:
    """Write every record of `topics` (read_uncommitted: aborted and open transactions' records too)
    to `dest/<topic>.jsonl`, one JSON object per record (partition, offset, timestamp, key, headers,
    value; bytes as UTF-8 with replacements), so a failed check can be walked back after the test's
    broker is gone. A topic the broker does not have is skipped."""
    import orjson

    dest.mkdir(parents=True, exist_ok=True)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-dump-{time.monotonic_ns()}",
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False, "log_level": 3})
    try:
        existing = retrying(lambda: consumer.list_topics(timeout=10)).topics
        for topic in topics:
            if topic not in existing:
                continue
            parts = sorted(existing[topic].partitions)
            ends = {tp.partition: retrying(functools.partial(consumer.get_watermark_offsets, tp, timeout=10))[1]
                    for tp in (TopicPartition(topic, p) for p in parts)}
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
            remaining = {p for p in parts if ends[p] > 0}
            deadline = time.monotonic() + timeout_seconds
            with (dest / f"{topic}.jsonl").open("wb") as out:
                while remaining and time.monotonic() < deadline:
                    for m in consumer.consume(1000, 0.1):
                        if m.error() is not None:
                            continue
                        out.write(orjson.dumps({
                            "partition": m.partition(), "offset": m.offset(), "timestamp": m.timestamp()[1],
                            "key": _text(m.key()), "headers": [(k, _text(v)) for k, v in m.headers() or []],
                            "value": _text(m.value())}) + b"\n")
                        if m.offset() + 1 >= ends[m.partition()]:
                            remaining.discard(m.partition())
            consumer.unassign()
    finally:
        consumer.close()


def _text(value: bytes | str | None) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
