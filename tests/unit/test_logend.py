"""The one rule for a read to the end (keyrange/logend.py), on a consumer's answers alone."""

from __future__ import annotations

from typing import Any

from confluent_kafka import OFFSET_INVALID, TopicPartition

from keyrange.logend import spans_behind


class Answers:
    """A consumer's cached high watermarks and positions, as librdkafka would give them."""

    def __init__(self, highs: dict[int, int], positions: dict[int, int]) -> None:
        self.highs, self.positions = highs, positions

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        assert cached, "the end comes from the fetch responses, never from ListOffsets"
        return 0, self.highs[tp.partition]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions[tp.partition]) for tp in tps]


def behind(highs: dict[int, int], positions: dict[int, int], next_offsets: dict[int, int]) -> dict[Any, Any]:
    consumer: Any = Answers(highs, positions)
    return {p: v for (_, p), v in spans_behind(consumer, {("t", p): o for p, o in next_offsets.items()}).items()}


def test_a_partition_without_a_fetch_response_is_not_at_its_end_even_if_empty() -> None:
    assert behind({0: -1}, {0: OFFSET_INVALID}, {0: 0}) == {0: (0, -1)}


def test_the_position_past_a_transaction_marker_reaches_the_end_that_no_record_shows() -> None:
    # The last record is offset 9, the commit marker 10: the position is 11, the end 11.
    assert behind({0: 11}, {0: 11}, {0: 10}) == {}


def test_records_taken_count_before_the_position_moves() -> None:
    assert behind({0: 5, 1: 5}, {0: OFFSET_INVALID, 1: 3}, {0: 5, 1: 3}) == {1: (3, 5)}
