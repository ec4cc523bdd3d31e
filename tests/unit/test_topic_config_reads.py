"""Reading a topic's configuration when Kafka is slow: a timeout is worth waiting out, not an exit."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyrange import kafkaio
from keyrange.kafkaio import KafkaSetupError, KafkaUnreachable, max_message_bytes, until_reachable


class SlowAdmin:
    """An AdminClient whose describe_configs fails with `errors` in turn, then answers."""

    def __init__(self, errors: list[int]) -> None:
        self._errors = errors
        self.calls = 0

    def describe_configs(self, resources: list[object], request_timeout: float) -> dict[object, Future[object]]:
        self.calls += 1
        answers: dict[object, Future[object]] = {}
        for resource in resources:
            future: Future[object] = Future()
            if self._errors:
                future.set_exception(KafkaException(KafkaError(self._errors.pop(0))))
            else:
                future.set_result({})  # nothing listed: Kafka's default applies
            answers[resource] = future
        return answers


def test_a_config_read_that_times_out_is_waited_out_like_an_unreachable_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker on a loaded machine exited with "cannot read the configuration of topic ...: _TIMED_OUT"
    and was restarted (test_lifecycle's suspend and resume, at load 50): a timeout is Kafka slow or
    away, which `until_reachable` waits out; only other errors are the user's to fix."""
    admin = SlowAdmin([KafkaError._TIMED_OUT])
    monkeypatch.setattr(kafkaio, "admin_client", lambda *_, **__: admin)
    with pytest.raises(KafkaUnreachable, match="cannot read the configuration of topic 't'"):
        max_message_bytes("k:9092", ["t"])
    admin = SlowAdmin([KafkaError._TIMED_OUT])
    monkeypatch.setattr(kafkaio, "admin_client", lambda *_, **__: admin)
    limits = asyncio.run(until_reachable(lambda timeout: max_message_bytes("k:9092", ["t"], timeout),
                                         first_delay_seconds=0.01))
    assert limits == {"t": kafkaio.KAFKA_DEFAULT_MAX_MESSAGE_BYTES} and admin.calls == 2


def test_a_config_read_refused_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafkaio, "admin_client", lambda *_, **__: SlowAdmin([KafkaError.TOPIC_AUTHORIZATION_FAILED]))
    with pytest.raises(KafkaSetupError) as raised:
        max_message_bytes("k:9092", ["t"])
    assert not isinstance(raised.value, KafkaUnreachable)
