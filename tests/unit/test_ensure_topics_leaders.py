"""`ensure_topics` and partitions whose leaders do not serve yet: a stand-in AdminClient (the real
case, a fresh Kafka on a busy machine whose new topics' leaders take longer than the worker's first
5 s try, is not reproducible on demand). Leaders that do not serve yet are worth waiting for
(`until_reachable` retries KafkaUnreachable), and a retry, finding the topics created, must still
wait for their leaders rather than go on to a first read that fails."""

from __future__ import annotations

import re
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyrange import kafkaio
from keyrange.kafkaio import KafkaUnreachable, TopicSpec, ensure_topics


def _done(value: Any = None, error: KafkaException | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
    return future


class LeaderlessAdmin:
    """Creates topics; every ListOffsets answers NOT_LEADER_FOR_PARTITION until `serving`."""

    def __init__(self) -> None:
        self.serving = False
        self.asked: list[str] = []

    def create_topics(self, new_topics: list[Any], **_: Any) -> dict[str, Future[Any]]:
        return {t.topic: _done() for t in new_topics}

    def list_offsets(self, wanted: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        self.asked += [tp.topic for tp in wanted]
        error = None if self.serving else KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return {tp: _done(object(), error) for tp in wanted}


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> LeaderlessAdmin:
    fake = LeaderlessAdmin()
    existing: dict[str, int] = {}

    def partition_counts(*_: Any, **__: Any) -> dict[str, int]:
        return dict(existing)

    def create_topics(new_topics: list[Any], **kwargs: Any) -> dict[str, Future[Any]]:
        existing.update({t.topic: t.num_partitions for t in new_topics})
        return LeaderlessAdmin.create_topics(fake, new_topics, **kwargs)

    fake.create_topics = create_topics  # type: ignore[method-assign]
    monkeypatch.setattr(kafkaio, "admin_client", lambda *_, **__: fake)
    monkeypatch.setattr(kafkaio, "partition_counts", partition_counts)
    return fake


def test_new_topics_whose_leaders_do_not_serve_yet_are_worth_waiting_for(admin: LeaderlessAdmin) -> None:
    topics = [TopicSpec("events.processed", 2)]
    with pytest.raises(KafkaUnreachable, match="not served within"):
        ensure_topics("b:9092", topics, timeout_seconds=0.2)
    # The retry finds them created: it waits for their leaders all the same.
    admin.asked.clear()
    with pytest.raises(KafkaUnreachable, match="not served within"):
        ensure_topics("b:9092", topics, timeout_seconds=0.2)
    assert "events.processed" in admin.asked
    admin.serving = True
    assert ensure_topics("b:9092", topics, timeout_seconds=0.2) == {"events.processed": 2}


def test_a_created_topic_that_shows_in_metadata_a_moment_later_is_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # CreateTopics answers once the controller has the topic; a broker's metadata may show it a
    # moment later (seen on a busy machine: "does not appear in metadata within 10 s" at once).
    fake = LeaderlessAdmin()
    fake.serving = True
    reads: list[int] = []

    def partition_counts(*_: Any, **__: Any) -> dict[str, int]:
        reads.append(1)
        return {"events.processed": 2} if len(reads) >= 3 else {}

    monkeypatch.setattr(kafkaio, "admin_client", lambda *_, **__: fake)
    monkeypatch.setattr(kafkaio, "partition_counts", partition_counts)
    assert ensure_topics("b:9092", [TopicSpec("events.processed", 2)], timeout_seconds=2) == {"events.processed": 2}
    assert len(reads) == 3


def test_a_created_topic_missing_from_metadata_past_the_timeout_is_an_error_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = LeaderlessAdmin()
    fake.serving = True
    monkeypatch.setattr(kafkaio, "admin_client", lambda *_, **__: fake)
    monkeypatch.setattr(kafkaio, "partition_counts", lambda *_, **__: {})
    with pytest.raises(kafkaio.KafkaSetupError, match=re.escape("'events.processed' was created but does not "
                                                                "appear in metadata within 0.2 s")):
        ensure_topics("b:9092", [TopicSpec("events.processed", 2)], timeout_seconds=0.2)
