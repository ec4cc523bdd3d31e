"""The worker's one Kafka consumer, driven from asyncio through one dedicated thread.

confluent-kafka's Consumer is not thread-safe, so every call on it (fetch, assign, pause,
watermarks, close) runs on a single-thread executor and calls are serialized; a fetch that waits
for records gives way as soon as another call is queued behind it. The
consumer never joins a group: the range map, not Kafka, decides ownership, so partitions are
`incremental_assign`ed explicitly and the group id only keys the committed offsets (a group's
rebalances would fight the range map on any broker).

The lag's log ends also come from the brokers' ListOffsets answers (`ListedEnds`): asked without
waiting on the consumer's thread, one request at a time, and backed off while they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import ListOffsetsResultInfo, OffsetSpec

from keyrange.kafkaquirks import Backoff, known_log_end
from keyrange.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

R = TypeVar("R")

FETCH_WAIT_SECONDS = 0.5
"""How long one fetch blocks when nothing is buffered. A record or a queued call ends the wait at
once, so this only sets how often an idle worker's loop goes round (BENCHMARKS.md, idle workers)."""
PAUSED_FETCH_WAIT_SECONDS = 0.05
"""The same while a partition is paused for backpressure: the engine resumes it between two fetches,
so a long wait would leave a drained partition idle (BENCHMARKS.md, "A hot partition that idled
after each pause")."""
FETCH_WAIT_MAX_MS = 50
"""How long the broker may hold the worker's fetch when it has nothing new (`fetch.wait.max.ms`).
Apache Kafka answers as soon as a record arrives, so latency does not depend on it; tansu answers
only at the wait's end. Each idle fetch costs the broker CPU, but librdkafka keeps one fetch per
broker in flight, so a partition assigned or resumed behind a held one waits for it: its default,
500 ms, is too long for a handoff (BENCHMARKS.md, idle workers)."""
FETCH_SLICE_SECONDS = 0.005
"""A waiting fetch checks this often whether a command (assign, unassign, pause...) is queued
behind it, and returns early if so: a handoff waits for those commands."""
FETCH_QUEUE_BACKOFF_MS = 10
"""How long librdkafka waits before fetching a partition again once its prefetch queue was full
(librdkafka's default: 1000 ms). A busy partition's queue is full whenever the worker pauses it for
backpressure, and pausing drops what it holds: with the default a resumed partition fetched
nothing for up to a second (a hot client drained at half the rate: BENCHMARKS.md)."""
LIST_OFFSETS_TIMEOUT_SECONDS = 2.0
"""How long one ListOffsets request for the lag may take before its answer is given up."""
LIST_OFFSETS_RETRY_SECONDS = (1.0, 60.0)
"""After a failed ListOffsets, the first and the longest wait before the next (doubling): librdkafka
spins on a core while an admin request waits for a broker it cannot reach (docs/kafka.md)."""
LIST_OFFSETS_ABANDON_SECONDS = 5 * LIST_OFFSETS_TIMEOUT_SECONDS
"""A ListOffsets request still unanswered this long after it was asked (five times its own
timeout) is dropped as failed: one that never completes would otherwise freeze the lag's log end
for good (and with it the fetch stall check, which needs an end past the position), as librdkafka
leaves other requests to a broker that went away unanswered."""


def worker_client_id(settings: WorkerSettings, role: str) -> str:
    """The client.id of one of the worker's Kafka clients, e.g. `keyrange-worker-2-fetch`: broker
    logs, quotas and librdkafka's own log lines (`keyrange-worker-2-fetch#consumer-1`) then say
    which worker and which of its clients a connection is. A client.id in the user's client
    properties wins."""
    return f"keyrange-worker-{settings.worker_id}-{role}"


def consumer_config(settings: WorkerSettings, role: str = "fetch", **overrides: Any) -> dict[str, Any]:
    """The consumer configuration of the worker (`role` fetch) and its restore reader (restore);
    read_committed: outputs of aborted transactions never count as handled."""
    # librdkafka's prefetch queue (64 MiB by default) is bounded like a partition's pending
    # events, so memory stays bounded in bytes however large the events are.
    prefetch_kbytes = min(65_536, max(1_024, settings.max_pending_bytes // 1024))
    return settings.clients.consumer(settings.group_id, {"client.id": worker_client_id(settings, role),
                                                         "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
                                                         "queued.max.messages.kbytes": prefetch_kbytes,
                                                         "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                                                         **overrides})


class ThreadedConsumer:
    """Async facade over one confluent Consumer whose calls all run on one thread."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._topic = settings.topic
        self._batch = settings.fetch_batch_size
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keyrange-consumer")
        self._consumer: Consumer | None = None
        self._settings = settings
        self._commands_queued = 0
        """Calls other than fetch submitted and not finished (read by the fetch thread)."""
        self._listed_ends = ListedEnds(settings.topic)
        self._paused: set[int] = set()
        """Partitions paused through `pause` and not resumed, assigned again or unassigned since."""

    async def _call(self, function: Callable[..., R], *args: Any) -> R:
        self._commands_queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        finally:
            self._commands_queued -= 1

    async def open(self) -> Any:
        """Create the consumer; return its group metadata (for send_offsets_to_transaction)."""

        def create() -> Any:
            self._consumer = Consumer(consumer_config(self._settings))
            self._listed_ends = ListedEnds(self._topic, AdminClient(self._settings.clients.admin(
                {"client.id": worker_client_id(self._settings, "admin")})))
            return self._consumer.consumer_group_metadata()

        return await self._call(create)

    @property
    def _c(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("consumer is not open")
        return self._consumer

    async def fetch(self) -> list[Message]:
        """Up to one batch of records: what is buffered now, else wait briefly for the first one.

        librdkafka's batch consume waits for a full batch or the timeout, which would add the
        whole timeout to latency at low rates; asking without waiting first avoids that.
        """

        def fetch_batch() -> list[Message]:
            consumer = self._c
            messages = consumer.consume(self._batch, 0)
            deadline = time.monotonic() + (PAUSED_FETCH_WAIT_SECONDS if self._paused else FETCH_WAIT_SECONDS)
            while not messages and not self._commands_queued and time.monotonic() < deadline:
                messages = consumer.consume(1, FETCH_SLICE_SECONDS)
                if messages:
                    messages.extend(consumer.consume(self._batch - 1, 0))
            return messages

        return await asyncio.get_running_loop().run_in_executor(self._executor, fetch_batch)

    async def assign(self, start_offsets: dict[int, int]) -> None:
        """Start fetching the given partitions from the given offsets."""
        tps = [TopicPartition(self._topic, p, o) for p, o in start_offsets.items()]
        if tps:
            await self._call(self._assign_unpaused, tps)
            self._paused.difference_update(start_offsets)

    def _assign_unpaused(self, tps: list[TopicPartition]) -> None:
        consumer = self._c
        if not consumer.assignment():
            # librdkafka asks for the metadata of a topic it does not know only at its next
            # once-a-second scan, so a first assignment would wait up to 1 s to fetch. Asking now
            # takes one round trip; if it fails, the scan still finds the topic.
            with contextlib.suppress(KafkaException):
                consumer.list_topics(self._topic, timeout=self._settings.kafka_timeout_seconds)
        consumer.incremental_assign(tps)
        # librdkafka keeps a partition's pause flag across unassign and assign: a slot released
        # while paused for backpressure would come back paused, fetch nothing, and (its cached
        # high watermark frozen) even show no lag. The engine's new partition state starts
        # unpaused, so the consumer must too.
        consumer.resume(tps)

    async def seek(self, offsets: dict[int, int]) -> None:
        """Fetch the given assigned partitions from the given offsets next, unpaused (records
        buffered past them are dropped and fetched again). Assigned afresh: librdkafka refuses a
        seek of a partition whose fetch has not started yet."""
        tps = [TopicPartition(self._topic, p, o) for p, o in offsets.items()]
        if tps:
            await self._call(self._reassign, tps)
            self._paused.difference_update(offsets)

    def _reassign(self, tps: list[TopicPartition]) -> None:
        self._c.incremental_unassign([TopicPartition(tp.topic, tp.partition) for tp in tps])
        self._assign_unpaused(tps)

    async def unassign(self, partitions: Iterable[int]) -> None:
        """Stop fetching the given partitions; buffered records of them are discarded. One not
        assigned is left alone: sibling slots released at once each unassign their partition."""
        wanted = set(partitions)
        if wanted:
            await self._call(self._unassign_assigned, wanted)
            self._paused -= wanted

    def _unassign_assigned(self, partitions: set[int]) -> None:
        consumer = self._c
        # librdkafka refuses to unassign a partition that is not assigned, and fails the whole call.
        tps = [TopicPartition(self._topic, tp.partition) for tp in consumer.assignment()
               if tp.topic == self._topic and tp.partition in partitions]
        if tps:
            consumer.incremental_unassign(tps)

    async def pause(self, partitions: Iterable[int]) -> None:
        """Stop fetching the given partitions (backpressure) while keeping them assigned."""
        tps = [TopicPartition(self._topic, p) for p in partitions]
        if tps:
            await self._call(self._c.pause, tps)
            self._paused.update(tp.partition for tp in tps)

    async def resume(self, partitions: Iterable[int]) -> None:
        """Fetch paused partitions again."""
        tps = [TopicPartition(self._topic, p) for p in partitions]
        if tps:
            await self._call(self._c.resume, tps)
            self._paused.difference_update(tp.partition for tp in tps)

    async def positions(self, partitions: Iterable[int]) -> dict[int, int]:
        """The offset the consumer returns next per partition (-1 when it has none yet): past what
        it returned and past the commit markers it read after that."""
        tps = [TopicPartition(self._topic, p) for p in partitions]
        if not tps:
            return {}
        found = await self._call(self._c.position, tps)
        return {tp.partition: max(tp.offset, -1) for tp in found}

    async def high_watermarks(self, partitions: Iterable[int]) -> dict[int, int]:
        """High watermark per partition (-1 when unknown): `known_log_end` of the one last seen in
        fetch responses (frozen while a partition is paused for backpressure) and the broker's last
        ListOffsets answer, which is at most one call old. The request never waits on the
        consumer's thread or the network: its answer is taken by the next call.
        """
        wanted = list(partitions)

        def highs() -> dict[int, int]:
            out = {}
            for p in wanted:
                out[p] = self._c.get_watermark_offsets(TopicPartition(self._topic, p), cached=True)[1]
            return out

        cached = await self._call(highs)
        listed = self._listed_ends.tick(wanted)
        return {p: known_log_end(high, listed.get(p, -1)) for p, high in cached.items()}

    async def close(self) -> None:
        """Close the consumer (no group to leave) and its thread."""
        if self._consumer is not None:
            await self._call(self._consumer.close)
            self._consumer = None
        self._listed_ends = ListedEnds(self._topic)  # confluent's AdminClient closes when collected
        self._executor.shutdown(wait=True)


class OffsetsAdmin(Protocol):
    """What `ListedEnds` needs of confluent's AdminClient."""

    def list_offsets(self, topic_partition_offsets: dict[TopicPartition, OffsetSpec],
                     **kwargs: Any) -> dict[TopicPartition, Future[ListOffsetsResultInfo]]:
        """One ListOffsets request; a future per partition."""


class ListedEnds:
    """The input partitions' log ends as the broker's ListOffsets answers them: one request at a
    time, never waited on (its answer is taken by the next `tick`), and backed off while it fails,
    as librdkafka spins while an admin request waits for a broker it cannot reach."""

    def __init__(self, topic: str, admin: OffsetsAdmin | None = None, backoff: Backoff | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._topic = topic
        self._admin = admin
        """Who is asked (None: nobody, until the consumer is open)."""
        self._backoff = backoff or Backoff(*LIST_OFFSETS_RETRY_SECONDS)
        self._clock = clock
        self._listing: dict[TopicPartition, Future[ListOffsetsResultInfo]] = {}
        """The ListOffsets request in flight, if any."""
        self._asked_at = 0.0
        """When the request in flight was made."""
        self._ends: dict[int, int] = {}
        """Each partition's end as the last answer gave it."""

    def tick(self, partitions: list[int]) -> Mapping[int, int]:
        """Take the answer of the request in flight if it came, ask again for `partitions` unless a
        request is in flight or backed off, and return each partition's end as last answered."""
        self._take()
        self._ask(partitions)
        return MappingProxyType(self._ends)

    def _take(self) -> None:
        if not self._listing:
            return
        if not all(f.done() for f in self._listing.values()):
            if self._clock() - self._asked_at > LIST_OFFSETS_ABANDON_SECONDS:
                log.warning("a ListOffsets request for %s's log ends is unanswered after %.0f s; asking again",
                            self._topic, LIST_OFFSETS_ABANDON_SECONDS)
                self._listing = {}
                self._backoff.failed()
            return
        failed = False
        for tp, future in self._listing.items():
            # A partition whose leader could not be asked comes back as a result, with offset -1001.
            offset = future.result().offset if future.exception() is None else -1
            if offset >= 0:
                self._ends[tp.partition] = max(self._ends.get(tp.partition, -1), offset)
            else:
                failed = True
        self._listing = {}
        if failed:
            self._backoff.failed()
        else:
            self._backoff.succeeded()

    def _ask(self, partitions: list[int]) -> None:
        if self._listing or not partitions or self._admin is None or not self._backoff.ready():
            return
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        request = {TopicPartition(self._topic, p): latest for p in partitions}
        try:
            self._asked_at = self._clock()
            self._listing = self._admin.list_offsets(request, isolation_level=IsolationLevel.READ_UNCOMMITTED,
                                                     request_timeout=LIST_OFFSETS_TIMEOUT_SECONDS)
        except KafkaException:
            self._listing = {}  # the fetch responses' value stands alone until the next call
            self._backoff.failed()
