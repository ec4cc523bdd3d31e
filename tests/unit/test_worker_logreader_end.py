"""A read to the end stops at the end it was first told (worker/logreader.py `LogReader.read`): a
partition that another producer keeps writing in transactions always has one open, so the
read_committed position never catches the newest high watermark, and a read chasing it (a
read-ahead while the old owner still commits, a hash range's siblings) would not end."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from keyrange.worker.logreader import LogReader
from keyrange.worker.settings import WorkerSettings

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="w0",
                          kafka_timeout_seconds=1.0)


class BusyPartition:
    """One partition another producer appends to in back-to-back transactions: every fetch response
    reports a high watermark 10 further on, and the position stops 5 short of it (at the open
    transaction's first record)."""

    def __init__(self) -> None:
        self.high = -1
        self.fetches = 0

    def list_topics(self, topic: str | None = None, timeout: float | None = None) -> Any:
        return None

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self.fetches += 1
        assert self.fetches < 1000, "the read chased the end"
        self.high = 10 * self.fetches
        return []

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False, **_: Any) -> tuple[int, int]:
        assert cached
        return 0, self.high

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, max(0, self.high - 5)) for tp in tps]

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        pass

    def unassign(self) -> None:
        pass


def test_a_read_to_the_end_of_a_partition_written_in_back_to_back_transactions_ends() -> None:
    partition = BusyPartition()
    reader = LogReader(SETTINGS, consumer=partition)  # type: ignore[arg-type]
    _, ends = reader.read({("events.processed", 0): 0})
    # The first round (a batch take and a short wait: two responses) said 20; the position passed
    # it in the next (35): everything written before the read began is below it, and every
    # transaction below it is decided.
    assert ends == {("events.processed", 0): 20}
    assert partition.fetches == 4


def test_a_read_ahead_follows_the_end_a_bounded_number_of_times() -> None:
    # What it reads on to is not read inside the handoff's pause; bounded, it still ends.
    partition = BusyPartition()
    reader = LogReader(SETTINGS, consumer=partition)  # type: ignore[arg-type]
    _, ends = reader.read({("events.processed", 0): 0}, follow=2)
    assert ends == {("events.processed", 0): 60}  # reached 20 at 35, 40 at 55, 60 at 75: no follow left
    assert partition.fetches == 8
