"""Reading partitions of the processed topic with confluent-kafka, for `kafka_datasource` (no Spark here).

Two reads: where each partition ends now (`EndProbe`, on the Spark driver) and one partition's
offset range `[start, end)` (`read_range`, in a Spark task). Both read with
`isolation.level=read_committed` by default, so records of aborted worker transactions never
reach the aggregates and records of open transactions wait for a later micro-batch.

The probe consumes to the end instead of asking ListOffsets (a tansu workaround: its ListOffsets
can answer too low, docs/kafka.md). Consuming to the end and taking the consumer's position
is correct on every broker: librdkafka moves the position past transaction markers and stops at
the last stable offset. "The end" is the last stable offset that the brokers' fetch responses
report (librdkafka's statistics, `ls_offset`); an empty poll alone proves nothing on a loaded
machine, where fetch responses come late. The probe keeps its position between calls, so each
record is read once by the probe over the life of a query, not once per micro-batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, TopicPartition

from keyrange.errors import UserError
from keyrange.kafkaclients import KafkaClients

STATS_INTERVAL_MS = 100
"""How often the end probe's consumer reports each partition's last stable offset."""


class KafkaReadError(UserError, RuntimeError):
    """The processed topic could not be read as planned."""


@dataclass(frozen=True)
class ReaderSettings:
    """How the data source talks to Kafka (parsed from the Spark source options)."""

    bootstrap: str
    """Kafka bootstrap servers."""
    topic: str
    """The topic to read (the processed-record topic)."""
    isolation_level: str = "read_committed"
    """`read_committed` hides aborted and open transactions; `read_uncommitted` does not."""
    read_timeout_seconds: float = 120.0
    """A task reading a range fails after this long without progress (names the partition)."""
    probe_idle_ms: int = 200
    """How long one poll of the end probe waits for records."""
    extra: Mapping[str, str] = field(default_factory=dict)
    """Further librdkafka settings (the `kafka.`-prefixed source options, e.g. security)."""

    def consumer_config(self, purpose: str) -> dict[str, Any]:
        """librdkafka settings for a consumer that only assigns (no group join, no commits)."""
        # A group id is required by librdkafka; it is never joined nor committed to.
        return KafkaClients(self.bootstrap, self.extra).consumer(
            f"keyrange-aggregate-{purpose}", {"fetch.wait.max.ms": 50}, isolation_level=self.isolation_level)


def partitions_of(consumer: Consumer, topic: str, timeout_seconds: float = 10.0) -> list[int]:
    """The partition ids of `topic`, or KafkaReadError saying the topic is missing."""
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_seconds)
    except KafkaException as exc:
        raise KafkaReadError(f"cannot read metadata of topic {topic!r}: {exc.args[0]}") from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise KafkaReadError(
            f"topic {topic!r} does not exist; start the workers first (they create "
            "`<topic>.processed`) or pass the right --topic"
        )
    return sorted(info.partitions)


class EndProbe:
    """Finds the current end (next offset to read) of every partition by consuming to it."""

    def __init__(self, settings: ReaderSettings) -> None:
        self._settings = settings
        config = settings.consumer_config("probe")
        config.update({"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self._on_stats})
        self._consumer = Consumer(config)
        self._known: dict[int, int] = {}
        self._stable: dict[int, int] = {}
        """Each partition's last stable offset in the newest fetch response (-1: none yet)."""
        self._snapshots = 0

    def _on_stats(self, text: str) -> None:
        """librdkafka's statistics (served from `consume`): each partition's last stable offset."""
        topic = json.loads(text).get("topics", {}).get(self._settings.topic, {})
        for partition, figures in topic.get("partitions", {}).items():
            if int(partition) >= 0:  # -1 is librdkafka's "unassigned" pseudo-partition
                self._stable[int(partition)] = int(figures.get("ls_offset", -1))
        self._snapshots += 1

    def low_offsets(self) -> dict[int, int]:
        """The first offset still stored in each partition (the `earliest` starting point)."""
        lows: dict[int, int] = {}
        for p in partitions_of(self._consumer, self._settings.topic):
            low, _ = self._consumer.get_watermark_offsets(TopicPartition(self._settings.topic, p), timeout=10)
            lows[p] = max(0, low)
        return lows

    def ends(self, start: Mapping[int, int]) -> dict[int, int]:
        """The end of every partition now; never below `start` (nor below an earlier answer)."""
        topic = self._settings.topic
        parts = partitions_of(self._consumer, topic)
        begin = {p: max(start.get(p, 0), self._known.get(p, 0)) for p in parts}
        self._consumer.assign([TopicPartition(topic, p, begin[p]) for p in parts])
        # Statistics from before this call may describe an older end: wait for two newer ones.
        fresh_after = self._snapshots + 2
        deadline = time.monotonic() + self._settings.read_timeout_seconds
        idle_s = self._settings.probe_idle_ms / 1000
        while time.monotonic() < deadline:
            self._consumer.consume(100_000, idle_s)  # only the position matters
            positions = self._positions(parts, begin)
            if self._snapshots >= fresh_after and all(
                    0 <= self._stable.get(p, -1) <= positions[p] for p in parts):
                break
        else:
            raise KafkaReadError(
                f"could not find the end of topic {topic!r} within "
                f"{self._settings.read_timeout_seconds:g} s; is the broker reachable?"
            )
        self._known.update(positions)
        return {p: self._known[p] for p in parts}

    def _positions(self, parts: list[int], begin: Mapping[int, int]) -> dict[int, int]:
        """The consumer's position in each partition (where it began if it has none yet)."""
        topic = self._settings.topic
        found = {}
        for tp in self._consumer.position([TopicPartition(topic, p) for p in parts]):
            position = tp.offset if tp.offset != OFFSET_INVALID and tp.offset >= 0 else begin[tp.partition]
            found[tp.partition] = max(position, begin[tp.partition])
        return found

    def close(self) -> None:
        """Leave the broker (no group was joined, nothing is committed)."""
        self._consumer.close()


@dataclass(frozen=True)
class RecordChunk:
    """Columns of up to `chunk_rows` consecutive records of one partition."""

    partition: int
    offsets: list[int]
    timestamps_ms: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]


def read_range(settings: ReaderSettings, partition: int, start: int, end: int,
               chunk_rows: int = 20_000) -> Iterator[RecordChunk]:
    """Every committed record of `partition` with start <= offset < end, in offset order."""
    if end <= start:
        return
    consumer = Consumer(settings.consumer_config("reader"))
    tp = TopicPartition(settings.topic, partition, start)
    try:
        consumer.assign([tp])
        chunk = RecordChunk(partition, [], [], [], [])
        last_progress = time.monotonic()
        while True:
            # A short poll: consume() waits the whole timeout unless `chunk_rows` arrive, and most
            # ranges are smaller than that.
            messages = consumer.consume(chunk_rows, 0.1)
            done = False
            for m in messages:
                if m.error() is not None:
                    _raise_unless_benign(m, settings.topic)
                    continue
                offset = m.offset() or 0  # never None for a delivered record
                if offset >= end:
                    done = True
                    break
                _append(chunk, m, offset)
                done = offset >= end - 1
            if messages:
                last_progress = time.monotonic()
            if len(chunk.offsets) >= chunk_rows:
                yield chunk
                chunk = RecordChunk(partition, [], [], [], [])
            # Transaction markers and aborted records at the end of the range are never
            # delivered; the position moving past `end` says the range is complete.
            if not done:
                position = consumer.position([TopicPartition(settings.topic, partition)])[0].offset
                done = position >= end
            if done:
                break
            if time.monotonic() - last_progress > settings.read_timeout_seconds:
                raise KafkaReadError(
                    f"reading {settings.topic}[{partition}] offsets {start}..{end - 1} made no progress "
                    f"for {settings.read_timeout_seconds:g} s (stuck before offset "
                    f"{(chunk.offsets or [start])[-1]}); were records deleted, or is the broker down?"
                )
        if chunk.offsets:
            yield chunk
    finally:
        consumer.close()


def _append(chunk: RecordChunk, m: Message, offset: int) -> None:
    chunk.offsets.append(offset)
    chunk.timestamps_ms.append(m.timestamp()[1])
    chunk.keys.append(m.key())
    chunk.values.append(m.value())


def _raise_unless_benign(message: Message, topic: str) -> None:
    error = message.error()
    # End-of-partition events are informational (and only sent when enabled).
    if error is not None and error.code() != KafkaError._PARTITION_EOF:
        raise KafkaReadError(f"error reading {topic}[{message.partition()}]: {error.str()}")
