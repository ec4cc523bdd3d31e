"""Test helpers' reads from Kafka retried while a broker restarts, as a user's tools would retry them.

A broker that was just stopped, restarted or frozen answers nothing for a while, and right after it
is back its group coordinator may still be loading: a read in that window times out (confluent's
`_TIMED_OUT`, `KafkaUnreachable` from keyrange's own calls) although nothing is wrong with what the
test checks. Such reads are tried again until RETRY_SECONDS have passed; any other error, and the
last timeout after the deadline, reach the test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from keyrange.kafkaio import KafkaUnreachable

T = TypeVar("T")

RETRY_SECONDS = 120.0
"""How long a read is tried again: a Kafka node restarted on a busy 2-core machine was measured
taking over 90 s to serve again (tests/conftest.py)."""
PAUSE_SECONDS = 0.5
"""Between two tries: a timed-out call has already waited its own timeout."""
TRANSIENT_CODES = frozenset({
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._WAIT_COORD,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.REQUEST_TIMED_OUT,
})
"""What a broker that is down, restarting or loading its coordinator answers."""


def is_transient(exc: BaseException) -> bool:
    """True if `exc` is what a read gets from a broker that is away for a while (module docstring)."""
    if isinstance(exc, KafkaUnreachable):
        return True  # keyrange's own wording of a timeout
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        error: KafkaError = exc.args[0]
        return error.code() in TRANSIENT_CODES or error.retriable()
    return False


def retrying(read: Callable[[], T], seconds: float = RETRY_SECONDS,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> T:
    """`read()`, tried again after a transient failure (is_transient) until `seconds` have passed."""
    deadline = clock() + seconds
    while True:
        try:
            return read()
        except Exception as exc:
            if not is_transient(exc) or clock() >= deadline:
                raise
        sleep(PAUSE_SECONDS)


def wait_for_group_coordinator(bootstrap: str, seconds: float = RETRY_SECONDS) -> None:
    """Return once the cluster at `bootstrap` takes a group's offset commit.

    A cluster just started creates its offsets topic on the first group request and answers
    NOT_COORDINATOR until that topic is loaded; a session's broker is made ready this way once, so
    that no test's first commit meets a cluster younger than any a user would run."""
    from confluent_kafka import Consumer, TopicPartition

    from keyrange.kafkaio import TopicSpec, ensure_topics

    topic = "keyrange-tests-ready"
    ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-g", "log_level": 3})
    try:
        retrying(lambda: consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False), seconds)
    finally:
        consumer.close()
