"""Two range controllers on one consumer group: two operator releases, or an operator and
`keyrange run`, on the same group. Each claim of the controller role fences the one before it at
the broker; the cluster's range control used to claim the role back on every fence, so the two
fenced each other forever. Now the fenced one stands down and says why in its status."""

from __future__ import annotations

import time
from collections.abc import Callable

from keyrange.operator.clusterassigner import KafkaRangeControl
from keyrange.ranges.channel import ControlChannel
from keyrange.spec import parse_spec


def _wait_for(condition: Callable[[], bool], what: str, timeout_seconds: float = 60) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_range_control_fenced_by_another_controller_stands_down_instead_of_fencing_it_back(
        any_bootstrap: str, topic_name: str) -> None:
    group = f"{topic_name}-g"
    spec = parse_spec({"kafka": {"bootstrapServers": any_bootstrap, "topic": topic_name, "partitions": 4,
                                 "groupId": group},
                       "workers": {"min": 1, "max": 4}, "scaling": {"cooldownSeconds": 0}})
    first = KafkaRangeControl("release-a", "payments", spec, step_seconds=0.05, retry_seconds=0.2)
    second = None
    reader = None
    try:
        _wait_for(lambda: first.status().epoch == 1 and first.status().problem is None, "the first controller")
        second = KafkaRangeControl("release-b", "payments", spec, step_seconds=0.05, retry_seconds=0.2)
        _wait_for(lambda: second.status().epoch == 1, "the second controller")  # its claim fenced the first
        refused = first.request_scale("up", "test")
        assert not refused.applied
        assert "another controller claimed it" in refused.detail, refused.detail
        time.sleep(1.0)  # five of the first's retry periods: time enough to claim the role back, if it did
        outcome = second.request_scale("up", "test")
        assert outcome.applied, outcome.detail
        problem = first.status().problem
        assert problem is not None and f"consumer group {group!r}" in problem and "stop the other one" in problem
        assert second.status().problem is None
        reader = ControlChannel(any_bootstrap, group, "reader")
        _wait_for(lambda: (reader.catch_up(), reader.state.prepare)[1] is not None, "the second's prepare")
    finally:
        for control in (first, second):
            if control is not None:
                control.close()
        if reader is not None:
            reader.close()
