"""A controller whose write timed out while the broker was frozen writes again once it is back.

Apache Kafka only, on a node of the test's own that it freezes (SIGSTOP): the embedded broker
is shared by the whole session.
"""

from __future__ import annotations

import time

import pytest

from keyrange.local.kafka_cluster import KafkaCluster
from keyrange.ranges import channel as channel_module
from keyrange.ranges.channel import ControlChannel, ControlWriteFailed, Publication
from keyrange.ranges.rangemap import RangeMap

pytestmark = pytest.mark.slow


def newest_epoch(bootstrap: str, group: str) -> int:
    reader = ControlChannel(bootstrap, group, "reader")
    try:
        reader.catch_up()
        return reader.state.publication.map.epoch if reader.state.publication else -1
    finally:
        reader.close()


def test_a_controller_writes_again_after_a_write_timed_out_on_a_frozen_broker(
        own_kafka: KafkaCluster, topic_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap, group = own_kafka.bootstrap, f"{topic_name}-g"
    ControlChannel.ensure_topic(bootstrap, group)
    controller = ControlChannel(bootstrap, group, "controller")
    try:
        controller.claim_writer()
        controller.publish(Publication(RangeMap.even(4, 1, epoch=1)))
        monkeypatch.setattr(channel_module, "WRITE_TIMEOUT_SECONDS", 2.0)
        node = own_kafka.node(1)
        node.pause()
        try:
            with pytest.raises(ControlWriteFailed):
                controller.publish(Publication(RangeMap.even(4, 2, epoch=2)))
        finally:
            node.resume()
        monkeypatch.setattr(channel_module, "WRITE_TIMEOUT_SECONDS", 30.0)
        # The first write after the outage goes through (before: _CONFLICT on every write, forever).
        controller.publish(Publication(RangeMap.even(4, 1, epoch=3)))
        deadline = time.monotonic() + 30
        while newest_epoch(bootstrap, group) != 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert newest_epoch(bootstrap, group) == 3
    finally:
        controller.close()
