"""A model of a partition's logs for restore tests without a broker: records with their event time,
record timestamp and broker append time, a reader that answers `LogReader`'s calls from them as
Apache Kafka or tansu would, and the live dedup window to compare a restore with."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from keyrange.events import encode_input
from keyrange.logend import Span
from keyrange.worker.dedup import TtlSet
from keyrange.worker.restore import RestoredPartition, restore_with
from keyrange.worker.settings import WorkerSettings


@dataclass(frozen=True)
class Record:
    """One record of a modelled log."""

    offset: int
    timestamp_ms: int
    """The record timestamp (CreateTime): `created` for input events, per the wire contract."""
    appended_ms: int
    """Broker append time (what tansu's offsets_for_times matches)."""
    value: bytes | None = None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None


class FakeMessage:
    """The part of confluent_kafka.Message a restore reads."""

    def __init__(self, span: Span, record: Record) -> None:
        self._span = span
        self._record = record

    def topic(self) -> str:
        return self._span[0]

    def partition(self) -> int:
        return self._span[1]

    def offset(self) -> int:
        return self._record.offset

    def timestamp(self) -> tuple[int, int]:
        return 1, self._record.timestamp_ms

    def value(self) -> bytes | None:
        return self._record.value

    def key(self) -> bytes | None:
        return self._record.key

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._record.headers

    def error(self) -> None:
        return None


@dataclass
class ModelReader:
    """Answers a restore's reads from modelled logs. `broker` is "kafka" (offsets_for_times matches
    the record timestamp and answers the end past the last) or "tansu" (it matches append time and
    answers 0 for a time past the last record)."""

    logs: dict[Span, list[Record]]
    broker: str = "kafka"
    asked_times: dict[Span, int] = field(default_factory=dict)
    """The times the last offsets_at call asked for."""
    committed: dict[int, int] = field(default_factory=dict)
    """The group's committed offsets, per input partition (`start_offsets`)."""
    patient: bool = False
    """As LogReader's: the model never withholds records."""

    def connect(self, topics: object) -> None:
        """Nothing to connect to."""

    def close(self) -> None:
        """Nothing to close."""

    def start_offsets(self, topic: str, partitions: list[int], lookup: object = None) -> dict[int, int]:
        """The committed offset of each partition, or 0 (committed offsets are stable here: any lookup)."""
        return {p: self.committed.get(p, 0) for p in partitions}

    def bounds(self, spans: Iterable[Span]) -> dict[Span, tuple[int, int]]:
        """(first offset, end) of each modelled log."""
        return {span: (0, len(self.logs.get(span, []))) for span in spans}

    def read(self, starts: dict[Span, int], stops: dict[Span, int] | None = None,
             each: Callable[[Span, list[FakeMessage]], None] | None = None, follow: int = 0,
             cut: threading.Event | None = None) -> tuple[dict[Span, list[FakeMessage]], dict[Span, int]]:
        """Records from `starts` up to `stops` (exclusive; without a stop, to the end), handed to
        `each` if given, else returned; and the offset each span was read to. Nothing is appended
        while a modelled log is read, so `follow` finds no newer end. Once `cut` is set, the spans
        not read yet end where they start."""
        stops = stops or {}
        out, ends = {}, {}
        for span, start in starts.items():
            if cut is not None and cut.is_set():  # cut short: this span and the next ones not read
                ends[span] = start
                continue
            log = self.logs.get(span, [])
            end = len(log) if span not in stops else min(stops[span], len(log))
            out[span] = [FakeMessage(span, r) for r in log if start <= r.offset < end]
            ends[span] = max(start, end)
            if each is not None and out[span]:
                each(span, out[span])
                out[span] = []
        return out, ends

    def offsets_at(self, times_ms: dict[Span, int]) -> dict[Span, int]:
        """The first offset at or after each time, as the modelled broker answers."""
        self.asked_times = dict(times_ms)
        out = {}
        for span, t in times_ms.items():
            log = self.logs.get(span, [])
            if self.broker == "kafka":
                out[span] = next((r.offset for r in log if r.timestamp_ms >= t), len(log))
            else:
                out[span] = next((r.offset for r in log if r.appended_ms >= t), 0)
        return out


def input_record(offset: int, uuid: str, created_ms: int, appended_ms: int) -> Record:
    """An input event in the default format, its record timestamp its `created`."""
    key, value = encode_input(1, uuid, created_ms)
    return Record(offset, created_ms, appended_ms, value, key)


@dataclass
class LiveRun:
    """A partition as its owner handled it: per offset, the event's uuid and the owner's wall clock."""

    ttl_seconds: float
    records: list[Record] = field(default_factory=list)
    uuids: list[str] = field(default_factory=list)
    handled_at_s: list[float] = field(default_factory=list)

    def add(self, uuid: str, created_ms: int, appended_ms: int, handled_at_s: float) -> None:
        """Append one event and when the owner handled it."""
        self.records.append(input_record(len(self.records), uuid, created_ms, appended_ms))
        self.uuids.append(uuid)
        self.handled_at_s.append(handled_at_s)

    def window(self, upto: int) -> tuple[TtlSet, Callable[[float], None]]:
        """The owner's window after the events before `upto`, and how to move its wall clock on."""
        now = [float("-inf")]
        window = TtlSet(self.ttl_seconds, lambda: now[0])
        for offset in range(upto):
            now[0] = self.handled_at_s[offset]
            window.add_if_new(self.uuids[offset], self.records[offset].timestamp_ms / 1000)

        def set_wall(t: float) -> None:
            now[0] = t

        return window, set_wall


def restored_window(settings: WorkerSettings, reader: ModelReader, partition: int, committed: int,
                    now_s: float) -> tuple[TtlSet, RestoredPartition, Callable[[float], None]]:
    """Restore `partition` from `committed` at `now_s` and fill a window as SlotState does."""
    counts = {settings.topic: partition + 1, settings.sink: partition + 1, settings.dlq: partition + 1}
    restored = restore_with(reader, settings, {partition: committed}, counts, now_s)[partition]  # type: ignore[arg-type]
    now = [now_s]
    window = TtlSet(settings.ttl_seconds, lambda: now[0])
    for uuid, event_s in restored.seen:
        window.replay(uuid, event_s)

    def set_wall(t: float) -> None:
        now[0] = t

    return window, restored, set_wall


def same_window(live: TtlSet, restored: TtlSet, uuids: Sequence[str]) -> list[str]:
    """How the two windows differ (empty: they are the same) in stream time and membership."""
    problems = []
    if live.stream_time != restored.stream_time:
        problems.append(f"stream time {restored.stream_time} restored, {live.stream_time} live")
    if len(live) != len(restored):
        problems.append(f"{len(restored)} entries restored, {len(live)} live")
    differing = sorted({u for u in uuids if (u in live) != (u in restored)})
    if differing:
        problems.append(f"membership differs for {differing[:10]}")
    return problems
