"""The worker's one Kafka consumer, driven from asyncio through one dedicated thread.

confluent-kafka's Consumer is not thread-safe, so every call on it (fetch, assign, pause,
watermarks, close) runs on a single-thread executor and calls are serialized; a fetch that waits
for records gives way as soon as another call is queued behind it. The
consumer never joins a group (joins are slow on tansu and the range map, not Kafka, decides
ownership): partitions are `incremental_assign`ed explicitly and the group id only keys the
committed offsets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import Consumer, Message, TopicPartition

from keyrange.worker.settings import WorkerSettings

R = TypeVar("R")

FETCH_WAIT_SECONDS = 0.05
"""How long one fetch blocks when nothing is buffered."""
FETCH_SLICE_SECONDS = 0.005
"""A waiting fetch checks this often whether a command (assign, unassign, pause...) is queued
behind it, and returns early if so: a handoff waits for those commands."""


def consumer_config(settings: WorkerSettings, **overrides: Any) -> dict[str, Any]:
    """The consumer configuration of the worker and its restore reader (read_committed: outputs of
    aborted transactions never count as handled)."""
    # Low fetch wait keeps created -> start latency small at modest rates.
    return settings.clients.consumer(settings.group_id, {"fetch.wait.max.ms": 20, **overrides})


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
            deadline = time.monotonic() + FETCH_WAIT_SECONDS
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

    def _assign_unpaused(self, tps: list[TopicPartition]) -> None:
        consumer = self._c
        consumer.incremental_assign(tps)
        # librdkafka keeps a partition's pause flag across unassign and assign: a slot released
        # while paused for backpressure would come back paused, fetch nothing, and (its cached
        # high watermark frozen) even show no lag. The engine's new partition state starts
        # unpaused, so the consumer must too.
        consumer.resume(tps)

    async def unassign(self, partitions: Iterable[int]) -> None:
        """Stop fetching the given partitions; buffered records of them are discarded."""
        tps = [TopicPartition(self._topic, p) for p in partitions]
        if tps:
            await self._call(self._c.incremental_unassign, tps)

    async def pause(self, partitions: Iterable[int]) -> None:
        """Stop fetching the given partitions (backpressure) while keeping them assigned."""
        tps = [TopicPartition(self._topic, p) for p in partitions]
        if tps:
            await self._call(self._c.pause, tps)

    async def resume(self, partitions: Iterable[int]) -> None:
        """Fetch paused partitions again."""
        tps = [TopicPartition(self._topic, p) for p in partitions]
        if tps:
            await self._call(self._c.resume, tps)

    async def high_watermarks(self, partitions: Iterable[int]) -> dict[int, int]:
        """High watermark per partition as last seen in fetch responses (-1 when unknown).

        The cached value is used on purpose: tansu answers ListOffsets with a high watermark that
        can be too low right after a batched produce, while its fetch responses carry the true one.
        """

        def highs() -> dict[int, int]:
            out = {}
            for p in partitions:
                out[p] = self._c.get_watermark_offsets(TopicPartition(self._topic, p), cached=True)[1]
            return out

        return await self._call(highs)

    async def close(self) -> None:
        """Close the consumer (no group to leave) and its thread."""
        if self._consumer is not None:
            await self._call(self._consumer.close)
            self._consumer = None
        self._executor.shutdown(wait=True)
