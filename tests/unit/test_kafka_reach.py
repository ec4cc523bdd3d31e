"""until_reachable: a worker waiting for its brokers says so early and still gives a slow cluster
its full timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from keyrange.kafkaio import (
    ClientPropertiesRefused,
    KafkaSetupError,
    KafkaUnreachable,
    StopRequested,
    partition_counts,
    until_reachable,
)


def failing(times: int, timeouts: list[float]) -> Callable[[float], str]:
    def call(timeout: float) -> str:
        timeouts.append(timeout)
        if len(timeouts) <= times:
            raise KafkaUnreachable(f"cannot reach Kafka within {timeout:g} s")
        return "answered"
    return call


def test_each_try_waits_twice_as_long_as_the_last_up_to_the_client_timeout(caplog: pytest.LogCaptureFixture) -> None:
    timeouts: list[float] = []
    result = asyncio.run(until_reachable(failing(4, timeouts), longest_timeout_seconds=30.0,
                                         first_delay_seconds=0.001))
    assert result == "answered"
    assert timeouts == [5.0, 10.0, 20.0, 30.0, 30.0]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4 and messages[0] == "cannot reach Kafka within 5 s; trying again in 0 s"


def test_a_client_timeout_shorter_than_the_first_try_is_the_limit() -> None:
    timeouts: list[float] = []
    asyncio.run(until_reachable(failing(1, timeouts), longest_timeout_seconds=2.0, first_delay_seconds=0.001))
    assert timeouts == [2.0, 2.0]


def test_a_stop_while_waiting_ends_the_wait() -> None:
    async def run() -> None:
        stop = asyncio.Event()
        stop.set()
        await until_reachable(failing(10, []), stop, first_delay_seconds=60.0)

    with pytest.raises(StopRequested, match="cannot reach Kafka"):
        asyncio.run(run())


def test_any_other_setup_error_is_raised_at_once() -> None:
    calls: list[float] = []

    def call(timeout: float) -> None:
        calls.append(timeout)
        raise KafkaSetupError("topic 'events' does not exist")

    with pytest.raises(KafkaSetupError, match="does not exist"):
        asyncio.run(until_reachable(call, first_delay_seconds=0.001))
    assert calls == [5.0]


@pytest.mark.parametrize(("properties", "named"), [
    ({"no.such.prop": "1"}, 'No such configuration property: "no.such.prop"'),
    ({"socket.timeout.ms": "soon"}, '"socket.timeout.ms"'),
])
def test_a_client_property_librdkafka_refuses_is_said_at_once_not_waited_out_as_kafka_away(
        properties: dict[str, str], named: str) -> None:
    calls: list[float] = []

    def call(timeout: float) -> dict[str, int]:
        calls.append(timeout)
        return partition_counts("127.0.0.1:1", timeout, properties)

    with pytest.raises(ClientPropertiesRefused) as info:
        asyncio.run(until_reachable(call, longest_timeout_seconds=30.0, first_delay_seconds=0.001))
    assert calls == [5.0]
    assert named in str(info.value) and "spec.kafka.clientProperties (or --kafka-property)" in str(info.value)
