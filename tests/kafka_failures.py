"""Kafka failures as confluent-kafka raises them, for tests that need no broker."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


def system_error_from(error: KafkaError) -> SystemError:
    """What confluent-kafka raises when its logger callback ran while the call's KafkaException was
    pending: a SystemError whose cause is that KafkaException."""
    try:
        try:
            raise KafkaException(error)
        except KafkaException as exc:
            raise SystemError("<built-in function isinstance> returned a result with an exception set") from exc
    except SystemError as wrapped:
        return wrapped
