"""OutputStage.too_large: an event whose outputs Kafka would refuse is found before its transaction."""

from __future__ import annotations

import itertools

import pytest

from keyrange.events import GROUP_HEADER, STATE_HEADER
from keyrange.worker.outputs import RECORD_OVERHEAD_BYTES, OutputStage
from keyrange.worker.settings import WorkerSettings

SETTINGS = WorkerSettings(bootstrap="x", topic="t", group_id="g")
LIMITS = {SETTINGS.sink: 2_000, SETTINGS.state: 1_200, SETTINGS.dlq: 2_000}


def refused(key: int, value: int, state: int | None) -> bool:
    """The rule written out: the processed record (key, value, group and state headers) against the
    sink's limit, the state record (key and state) against the changelog's."""
    group = len(GROUP_HEADER) + len(SETTINGS.group_id)
    with_state = 0 if state is None else len(STATE_HEADER) + state
    processed = key + value + group + with_state + RECORD_OVERHEAD_BYTES
    changelog = state is not None and key + state + RECORD_OVERHEAD_BYTES > LIMITS[SETTINGS.state]
    return processed > LIMITS[SETTINGS.sink] or changelog


@pytest.mark.parametrize("limits", [LIMITS, {}], ids=["limits-known", "no-limits"])
def test_too_large_refuses_exactly_what_either_topic_would(limits: dict[str, int]) -> None:
    stage = OutputStage(SETTINGS, {SETTINGS.topic: 4, SETTINGS.sink: 4, SETTINGS.dlq: 4, SETTINGS.state: 4}, limits)
    sizes = range(0, 2_100, 37)
    for key, value, state in itertools.product((4, 40), sizes, [None, *sizes]):
        why = stage.too_large(b"k" * key, b"v" * value, None if state is None else b"s" * state)
        expected = bool(limits) and refused(key, value, state)
        assert (why is not None) == expected, (key, value, state, why)
