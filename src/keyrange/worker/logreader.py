"""The consumer a restore reads its logs through (worker/restore.py, worker/restorer.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from keyrange.errors import UserError
from keyrange.kafkaquirks import PATIENT_FETCH_WAIT_MS, WHOLE_LOG_FROM, Backoff, withholds_records_below_end
from keyrange.logend import Span, fetched_end, reached
from keyrange.worker.consumer import consumer_config
from keyrange.worker.pacing import Pacer
from keyrange.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

POLL_SECONDS = 0.01
"""How long a read waits for a record when nothing is buffered; bounds how late it sees its end."""
FETCH_WAIT_MS = 5
"""How long the broker may hold a fetch at a log's end: every read ends with one such fetch."""
READ_BATCH = 5000
"""Records taken from the consumer's buffer in one call."""
PATIENCE_SECONDS = 0.5
"""How long a read goes without records below its end before it asks whether the broker withholds
them (kafkaquirks.withholds_records_below_end), and between two such questions."""


def close_in_background(close: Callable[[], object]) -> None:
    """Close a restore's consumer on a thread of its own: closing takes tens of milliseconds that
    nobody needs to wait for."""
    threading.Thread(target=close, name="keyrange-restore-close", daemon=True).start()


class RestoreError(UserError, RuntimeError):
    """A log could not be read to its end in time, so restoring would risk re-running events."""


class LogReader:
    """The one consumer every read of a restore goes through.

    A consumer per read cost a connection and metadata round trip each; reads of several topics
    and partitions share one assignment, so they fetch in parallel.

    Its fetches wait FETCH_WAIT_MS at a log's end, so that a read's last fetch costs little; a
    broker that answers them without the records it has (tansu, on a long partition) makes the
    reader `patient`: a consumer whose fetches wait PATIENT_FETCH_WAIT_MS takes over.
    """

    def __init__(self, settings: WorkerSettings, consumer: Consumer | None = None, patient: bool = False) -> None:
        self._settings = settings
        self.patient = patient
        """Whether this reader's fetches wait PATIENT_FETCH_WAIT_MS (told so, or it found its
        broker withholding records)."""
        self._consumer = consumer or self._new_consumer()
        self._known_topics: set[str] = set()
        self._pacer = Pacer()
        """Going through fetched records steps aside for the worker's event loop (pacing.py)."""

    def _new_consumer(self) -> Consumer:
        # The worker's own group id, to look up its committed offsets; this consumer only ever
        # assigns, so it never joins the group or commits.
        wait = PATIENT_FETCH_WAIT_MS if self.patient else FETCH_WAIT_MS
        return Consumer(consumer_config(self._settings, "restore", **{"fetch.wait.max.ms": wait}))

    def _become_patient(self) -> None:
        """Go on with a consumer whose fetches wait PATIENT_FETCH_WAIT_MS (librdkafka's wait is
        fixed when a consumer is made); the one before closes on a thread of its own."""
        self.patient = True
        old, self._consumer = self._consumer, self._new_consumer()
        topics, self._known_topics = self._known_topics, set()
        self._learn_topics(topics)
        close_in_background(old.close)

    def _patient_if_withheld(self, next_offsets: dict[Span, int]) -> None:
        """Go on reading the assigned spans (each from `next_offsets`, or its position when that is
        further) with a patient consumer if the broker answers their fetches without the records
        it has."""
        if not self._withholds_records(next_offsets):
            return
        at = {span: reached(self._consumer, span, offset) for span, offset in next_offsets.items()}
        log.info("the broker answered fetches of %s (topic, partition: next offset) with no records for %g s "
                 "below their end; reading on with fetches that wait %d ms", at, PATIENCE_SECONDS,
                 PATIENT_FETCH_WAIT_MS)
        self._consumer.unassign()
        self._become_patient()
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in at.items()])

    def _withholds_records(self, next_offsets: dict[Span, int]) -> bool:
        """Whether the broker answers fetches of a span below its end without records it has."""
        for span, next_offset in next_offsets.items():
            at = reached(self._consumer, span, next_offset)
            if fetched_end(self._consumer, span) <= at:
                continue
            try:
                listed = self._consumer.get_watermark_offsets(TopicPartition(*span),
                                                              timeout=self._settings.kafka_timeout_seconds)[1]
            except KafkaException:
                continue
            if withholds_records_below_end(at, int(listed)):
                return True
        return False

    def connect(self, topics: Iterable[str]) -> None:
        """Connect and fetch the topics' metadata now, so a later read does not wait for either."""
        self._learn_topics(set(topics))

    def _learn_topics(self, topics: set[str]) -> None:
        for topic in topics - self._known_topics:
            # Otherwise a topic this consumer has no metadata for waits for the next periodic
            # refresh (about 1 s) before its first fetch.
            self._consumer.list_topics(topic, timeout=self._settings.kafka_timeout_seconds)
            self._known_topics.add(topic)

    def _no_progress(self, spans: list[Span], timeout: float) -> str:
        """Why a read stopped moving, as far as can be told: a missing topic (nobody created it, e.g.
        no worker of the group ever started) would otherwise read like a stuck transaction."""
        what = f"reading {spans} (topic, partition) to the end made no progress for {timeout:g} s"
        missing = self._missing_topics(spans, timeout)
        if missing:
            return f"{what}: the broker has no topic {' or '.join(missing)}"
        return (f"{what} (an open transaction holds it back, or the broker does not answer); retry, or raise the "
                "Kafka timeout")

    def _missing_topics(self, spans: Iterable[Span], timeout: float) -> list[str]:
        try:
            existing = self._consumer.list_topics(timeout=timeout).topics
        except KafkaException:
            return []
        return sorted({t for t, _ in spans} - set(existing))

    def start_offsets(self, topic: str, partitions: Iterable[int], lookup: Consumer | None = None) -> dict[int, int]:
        """Where each partition resumes: the group's committed offset, or the first offset when none.
        This reader's consumer (read_committed) waits until no transaction in flight carries offsets
        of the partitions; a `lookup` consumer (`positions.committed_so_far_lookup`) answers with the
        offsets committed so far at once."""
        timeout = self._settings.kafka_timeout_seconds
        found = (lookup or self._consumer).committed([TopicPartition(topic, p) for p in partitions], timeout=timeout)
        return {tp.partition: tp.offset if tp.offset >= 0 else self._first_offset(topic, tp.partition) for tp in found}

    def _first_offset(self, topic: str, partition: int) -> int:
        """The partition's first offset: the one ListOffsets lists, or the first record a read from
        WHOLE_LOG_FROM finds below it (tansu can list one past a fresh partition's first batches)."""
        span = (topic, partition)
        listed = max(0, self._consumer.get_watermark_offsets(TopicPartition(*span),
                                                             timeout=self._settings.kafka_timeout_seconds)[0])
        if listed <= WHOLE_LOG_FROM:
            return listed
        first: list[int] = []
        found = threading.Event()

        def take(_span: Span, messages: list[Message]) -> None:
            if not first:
                first.append(messages[0].offset())  # type: ignore[arg-type]
            found.set()  # the first record is all this needs: not a read of everything below `listed`

        self.read({span: WHOLE_LOG_FROM}, {span: listed}, each=take, cut=found)
        return first[0] if first else listed

    def close(self) -> None:
        """Close the consumer (it never joined a group)."""
        self._consumer.close()

    def bounds(self, spans: Iterable[Span]) -> dict[Span, tuple[int, int]]:
        """(first offset, end) of each span as ListOffsets answers now. tansu workaround: tansu's
        end can be too low right after a write (logend.py): only a hint of where to start reading."""
        timeout = self._settings.kafka_timeout_seconds
        out = {}
        for span in spans:
            # A broker leaving the cluster fails a request in flight to it (_DESTROY_BROKER, a
            # transport error): the next one goes to the new leader. Tried again until the timeout.
            deadline, backoff = time.monotonic() + timeout, Backoff(0.05, 1.0)
            while True:
                try:
                    low, high = self._consumer.get_watermark_offsets(
                        TopicPartition(*span), timeout=max(0.1, deadline - time.monotonic()))
                    break
                except KafkaException as exc:
                    missing = self._missing_topics([span], timeout)
                    wait = backoff.failed()
                    if missing or time.monotonic() + wait > deadline:
                        why = f"the broker has no topic {missing[0]}" if missing else str(exc.args[0])
                        raise RestoreError(
                            f"cannot look up where {span} (topic, partition) begins and ends: {why}") from None
                    time.sleep(wait)
            out[span] = (int(low), int(high))
        return out

    def read(self, starts: dict[Span, int], stops: dict[Span, int] | None = None,
             each: Callable[[Span, list[Message]], None] | None = None, follow: int = 0,
             cut: threading.Event | None = None) -> tuple[dict[Span, list[Message]], dict[Span, int]]:
        """Records from `starts` up to `stops` (exclusive; a span without a stop: to the end), per
        span in log order; and the offset each span was read to. With `each`, the records are
        handed to it as they come (per span, in log order) instead, and the lists stay empty: a long
        read then holds one batch at a time.

        "The end" follows logend.py: the high watermark of the fetch responses, reached when the
        position (which moves past transaction markers) is there. It is the first high watermark
        this read was told, not the newest: a partition that others keep writing in transactions
        (the old owner during a read-ahead, a hash range's siblings) has one open at almost every
        fetch, which holds the read_committed position back from the newest end, so chasing that
        end can take any time. Every record written before the read began is below the first one,
        and the position passing it means every transaction below it is decided. The consumer keeps
        a partition's last high watermark after it is unassigned, so a span read to the end must not
        have been read before by this reader (a span with a stop may: the stop bounds it).

        `follow`: how many times a span without a stop that reached its end goes on to the newest
        end it was told, if that is further (a read-ahead: what it reads on is not read after the
        grant); bounded, so it ends however busily the partition is written.

        `cut`: once set, the read returns at its next batch, each span read to just past its last
        record handed over (a read-ahead that its acquire goes on from: `Restorer.prefetch`).
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
        self._learn_topics({t for t, _ in wanted})
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in wanted.items()])
        try:
            last: dict[Span, int] = {}
            timeout = self._settings.kafka_timeout_seconds
            # The deadline is for a read that stopped moving, not for the whole read: a large
            # changelog or backlog takes as long as it takes, as long as every `timeout` brings
            # records or moves a position.
            progress_at, progress_mark = time.monotonic(), -1
            asked_at = progress_at
            first_end: dict[Span, int] = {}
            follows = dict.fromkeys(wanted, follow)
            while wanted:
                if cut is not None and cut.is_set():
                    ends.update((span, max(last.get(span, -1) + 1, start)) for span, start in wanted.items())
                    return out, ends
                mark = sum(last.values()) + sum(ends.values())
                now = time.monotonic()
                if mark != progress_mark:
                    progress_at, progress_mark = now, mark
                elif now - progress_at > timeout:
                    raise RestoreError(self._no_progress(sorted(wanted), timeout))
                elif not self.patient and now - max(progress_at, asked_at) > PATIENCE_SECONDS:
                    asked_at = now
                    self._patient_if_withheld({span: max(last.get(span, -1) + 1, start)
                                               for span, start in wanted.items()})
                consumer = self._consumer
                # Take what is buffered; wait briefly only when nothing is (a batch consume waits
                # for a full batch or the timeout, which would add the timeout to every read).
                messages = consumer.consume(READ_BATCH, 0) or consumer.consume(1, POLL_SECONDS)
                taken = out if each is None else {span: [] for span in wanted}
                for m in self._pacer.paced(messages):
                    if m.error() is not None:
                        continue
                    # Every fetched record has a topic, partition and offset (the stubs say Optional).
                    span: Span = (m.topic(), m.partition())  # type: ignore[assignment]
                    offset: int = m.offset()  # type: ignore[assignment]
                    if span not in wanted or offset >= stops.get(span, offset + 1):
                        continue
                    last[span] = offset
                    taken[span].append(m)
                if each is not None:
                    for span, batch in taken.items():
                        if batch:
                            each(span, batch)
                done = []
                for span in wanted:
                    stop = stops.get(span)
                    if stop is None:
                        end = first_end.get(span, -1)
                        if end < 0:
                            end = fetched_end(consumer, span)
                            if end >= 0:
                                first_end[span] = end
                    else:
                        high = fetched_end(consumer, span)
                        end = min(stop, high) if high >= 0 else stop
                    if end >= 0 and reached(consumer, span, max(last.get(span, -1) + 1, wanted[span])) >= end:
                        if stop is None and follows[span] > 0 and (newest := fetched_end(consumer, span)) > end:
                            follows[span] -= 1
                            first_end[span] = newest
                            continue
                        done.append(TopicPartition(*span))
                        ends[span] = end
                if done:
                    for tp in done:
                        del wanted[(tp.topic, tp.partition)]
                    consumer.incremental_unassign(done)
            return out, ends
        finally:
            self._consumer.unassign()

    def offsets_at(self, times_ms: dict[Span, int]) -> dict[Span, int]:
        """First offset at or after the given time, per span, or the end when there is none."""
        if not times_ms:
            return {}
        timeout = self._settings.kafka_timeout_seconds
        found = self._consumer.offsets_for_times(
            [TopicPartition(t, p, ms) for (t, p), ms in times_ms.items()], timeout=timeout)
        out = {}
        for tp in found:
            # A broker's answer that is too early (tansu's: docs/kafka.md) only makes a longer read.
            out[(tp.topic, tp.partition)] = (
                tp.offset if tp.offset >= 0 else self._consumer.get_watermark_offsets(tp, timeout=timeout)[1])
        return out
