"""A worker's restores: a reader always connected for the next acquire, and logs read ahead.

A handoff's moved slots pause for as long as the new owner's acquire takes, so two things are
done before the grant rather than after it:
- **A connected reader.** A fresh consumer spends tens of milliseconds connecting and fetching
  metadata before its first read, so the reader for the next restore connects in the background
  as soon as the previous one is used up. Each reader serves one restore only: a consumer keeps a
  partition's last high watermark after unassigning it, which a later read "to the end" would
  take for the end (`LogReader.read`). Once a reader found its broker withholding records and
  turned patient (`LogReader`), the next ones start so.
- **Read-ahead (`prefetch`).** While the old owner still handles the slots, the new owner reads
  what a restore from the offsets committed by that moment (C0) would read (looked up without
  waiting for the old owner's transaction in flight: `positions.committed_so_far_lookup`), with
  every output and changelog span read to its end, and on to newer ends a bounded number of times
  (`LogReader.read`'s `follow`), and the input past C0 about as far as the old owner may still get
  (READ_AHEAD_PAST_COMMITTED), not through a lagging slot's whole backlog. After the grant, the
  restore from the final committed offsets C >= C0 reads only what was appended since
  (`restore_slots(..., prefetched)`): its window and outputs need nothing before what was read
  ahead, because both were read from lower bounds that cannot go back as the committed offset
  moves on (the window's stream time at C0, which the stream time at
  C is not below; when outputs of offsets >= C0 were written, which those of offsets >= C are not
  before: rebuild.plan_reads). Reading a span in two pieces returns what one read would: a read
  only ever stops at an offset below which every transaction is decided (the input is not
  transactional; read_committed reads stop at the last stable offset).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from keyrange.logend import Span
from keyrange.ranges.layout import SlotLayout
from keyrange.worker.logreader import LogReader, close_in_background
from keyrange.worker.positions import committed_so_far_lookup, slot_starts
from keyrange.worker.restore import (
    ParsedLogs,
    RestoredPartition,
    describe_restore,
    fold_logs,
    input_stops,
    plan_reads,
    restore_with,
)
from keyrange.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

READ_AHEAD_FOLLOWS = 2
"""How many times a read-ahead that reached a log's end reads on to its newest end (records
appended while it read, which the acquire would otherwise read inside the pause)."""
READ_AHEAD_PAST_COMMITTED = 1_000
"""How many input records past a slot's committed offset (C0) a read-ahead reads, or as many as the
window before C0 holds when that is more. Only what the old owner finishes before it releases is
needed there: an owner that keeps up finishes the records that arrive meanwhile, fewer than the
window holds (TTL's worth of them) while a handoff is shorter than the TTL. What it finishes past
this (one catching up a backlog may), the acquire reads."""


@dataclass
class Prefetched:
    """Logs read ahead for slots about to be acquired. Used once: the catch-up appends to `logs`."""

    committed: dict[int, int]
    """Per slot, the committed offset (C0) the read-ahead was planned from."""
    logs: ParsedLogs
    """The records read, parsed."""
    reached: dict[Span, int]
    """Per span, the offset the read reached (exclusive)."""


class Restorer:
    """Restores slots for one worker (see the module docstring). Blocking: call from a thread."""

    def __init__(self, settings: WorkerSettings, partition_counts: dict[str, int],
                 layout: SlotLayout | None = None) -> None:
        self._settings = settings
        self._counts = dict(partition_counts)
        self.layout = layout or SlotLayout(partition_counts[settings.topic])
        """How the input's partitions are cut into slots (the slots it restores are of this layout)."""
        self._topics = list(partition_counts)
        self._lock = threading.Lock()
        self._ready: Future[LogReader] | None = None
        self._closed = False
        self._patient = False
        """A reader found the broker withholding records (LogReader): the next ones start patient."""
        self._lookup: Consumer | None = None
        """The read-aheads' committed-offset lookup (`committed_so_far_lookup`), made with the first
        reader and connected to the group's coordinator beside it; shared by every read-ahead (it
        never fetches, so no read leaves a high watermark behind in it)."""
        self._lookup_busy = threading.Lock()
        """Held while a read-ahead looks up: the lookup's close waits for it (and for the warm-up)."""
        self._lookup_warmup: threading.Thread | None = None
        """The thread finding the lookup's coordinator (`_find_coordinator`); set once."""

    def connect_next_reader(self) -> None:
        """Start connecting the next reader (idempotent), and the read-aheads' lookup the first time."""
        with self._lock:
            if self._lookup is None and self._lookup_warmup is None and not self._closed:
                # Made once: if it cannot be, read-aheads look up through their reader (stable offsets).
                with contextlib.suppress(KafkaException):
                    self._lookup = committed_so_far_lookup(self._settings)
                self._lookup_warmup = threading.Thread(target=self._find_coordinator, args=(self._lookup,),
                                                       name="keyrange-restore-warmup", daemon=True)
                self._lookup_warmup.start()
            if self._ready is None and not self._closed:
                self._ready = Future()
                threading.Thread(target=self._connect, args=(self._ready,), name="keyrange-restore-warmup",
                                 daemon=True).start()

    def _connect(self, ready: Future[LogReader]) -> None:
        try:
            reader = LogReader(self._settings, patient=self._patient)
            try:
                reader.connect(self._topics)
            except Exception:
                reader.close()
                raise
            ready.set_result(reader)
        except Exception as exc:  # noqa: BLE001 - handed to the restore that takes this reader
            ready.set_exception(exc)

    def _find_coordinator(self, lookup: Consumer | None) -> None:
        """Have `lookup` find the group's coordinator now, so a read-ahead's first lookup is one round
        trip (a broker away now is met again by that lookup)."""
        if lookup is None:
            return
        with contextlib.suppress(KafkaException):
            lookup.committed([TopicPartition(self._settings.topic, 0)], timeout=self._settings.kafka_timeout_seconds)

    def _close_lookup(self, lookup: Consumer) -> None:
        """Close the lookup once no lookup is in flight (on its own thread: one may wait for a broker)."""
        if self._lookup_warmup is not None:
            self._lookup_warmup.join()
        with self._lookup_busy:
            lookup.close()

    def _take(self) -> LogReader:
        self.connect_next_reader()
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None:
            raise RuntimeError("restorer is closed")
        try:
            return ready.result(timeout=self._settings.kafka_timeout_seconds)
        except KafkaException:
            return LogReader(self._settings, patient=self._patient)  # the warm-up failed (broker away then)

    def _done_with(self, reader: LogReader) -> None:
        self._patient = self._patient or reader.patient
        close_in_background(reader.close)
        self.connect_next_reader()

    def prefetch(self, slots: Iterable[int], now_s: float | None = None,
                 cut: threading.Event | None = None) -> Prefetched:
        """Read ahead what restoring `slots` will need (the slots may still be handled elsewhere).
        Once `cut` is set it returns soon with what it read so far: `restore_slots` reads the rest."""
        reader = self._take()
        try:
            with self._lookup_busy:
                committed = self._starts(reader, slots, self._lookup)
            # Outputs for every partition: one that ends at C0 now may not at C.
            plan = plan_reads(reader, self._settings, committed, self._counts, now_s, skip_ended=False,
                              layout=self.layout)
            starts = dict(plan.starts)
            stops = {}
            for span, offset in input_stops(self._settings.topic, committed, self.layout).items():
                first = starts.setdefault(span, offset)  # C0 = 0: no window before it, but C may be later
                # Past C0 only about as much as the window before it holds (READ_AHEAD_PAST_COMMITTED):
                # a lagging slot's backlog is its new owner's to fetch, not this read's to parse.
                stops[span] = offset + max(offset - first, READ_AHEAD_PAST_COMMITTED)
            logs = ParsedLogs()
            after_last: dict[Span, int] = {}

            def take(span: Span, messages: list[Message]) -> None:
                logs.add(self._settings, span, messages)
                after_last[span] = messages[-1].offset() + 1  # type: ignore[operator]

            _, ends = reader.read(starts, stops, each=take, follow=READ_AHEAD_FOLLOWS, cut=cut)
            # A read can return records past the end it stopped at (they came in the same fetch).
            reached = {span: max(ends[span], after_last.get(span, 0)) for span in starts}
            return Prefetched(committed, logs, reached)
        finally:
            self._done_with(reader)

    def restore_slots(self, slots: Iterable[int], prefetched: Prefetched | None = None,
                      now_s: float | None = None) -> dict[int, RestoredPartition]:
        """Look up where each slot resumes (committed offset, else the first), then restore it,
        reading only what was appended since `prefetched` when that read-ahead covers the slots.
        Only after the slots' producers are initialised (the acquire's first step): every earlier
        transaction of them is then decided, so the committed offsets are looked up as committed so far
        (`positions.committed_so_far_lookup`); offsets still pending are a fenced producer's late write."""
        reader = self._take()
        try:
            # Not a stable lookup: it would wait for a fenced producer's late offsets (docstring).
            with self._lookup_busy:
                starts = self._starts(reader, slots, self._lookup)
            if prefetched is not None:
                caught_up = _catch_up(reader, self._settings, starts, prefetched, self.layout)
                if caught_up is not None:
                    log.info("restored %s", describe_restore(self._settings, caught_up, prefetched.logs, self.layout,
                                                             prefetched.committed))
                    return caught_up
            parsed = ParsedLogs()
            restored = restore_with(reader, self._settings, starts, self._counts, now_s, self.layout, parsed)
            log.info("restored %s", describe_restore(self._settings, restored, parsed, self.layout))
            return restored
        finally:
            self._done_with(reader)

    def _starts(self, reader: LogReader, slots: Iterable[int], lookup: Consumer | None = None) -> dict[int, int]:
        s = self._settings
        return slot_starts(reader, s.topic, s.state, slots, self.layout, lookup)

    def close(self) -> None:
        """Close the ready reader, if any; no reader is prepared after this."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, None
            lookup, self._lookup = self._lookup, None
        if lookup is not None:
            close_in_background(functools.partial(self._close_lookup, lookup))
        if ready is not None:
            with contextlib.suppress(Exception):
                ready.result(timeout=self._settings.kafka_timeout_seconds).close()


def _catch_up(reader: LogReader, settings: WorkerSettings, committed: dict[int, int],
              pre: Prefetched, layout: SlotLayout | None = None) -> dict[int, RestoredPartition] | None:
    """The restore from `committed` using `pre` plus what was appended since; None when `pre` does
    not cover it (other slots, or a committed offset that went back)."""
    layout = layout or SlotLayout.whole_partitions(committed)
    if set(committed) != set(pre.committed) or any(committed[s] < pre.committed[s] for s in committed):
        return None
    starts, stops = dict(pre.reached), {}
    for span, offset in input_stops(settings.topic, committed, layout).items():
        stops[span] = max(starts[span], offset)  # the window is what lies before C
    fresh, _ = reader.read(starts, stops)
    logs = pre.logs
    for span, messages in fresh.items():
        logs.add(settings, span, messages)
    return fold_logs(committed, logs, layout)
