"""Two consumer groups on one input topic share the default sink and DLQ, and never each other's work.

A restore skips events whose outputs it finds past the committed offset and takes the client
state those outputs carry: it must trust only outputs its own group wrote (header
`keyrange.group`), or the second consumer would skip everything the first one handled and load
the first one's ledger.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
import pytest

from keyrange.events import GROUP_HEADER
from tests.checkers import check_all, first_occurrences
from tests.integration.worker_helpers import produce_stream, run_worker_until, settings_for
from tests.kafkatools import read_counts, read_input_log, read_topic


@pytest.fixture
def bootstrap(any_bootstrap: str) -> str:
    """Every test of this module runs on tansu and on Apache Kafka (tests/conftest.py's `broker_engine`)."""
    return any_bootstrap


async def test_a_second_group_on_the_same_topic_handles_every_event_itself(bootstrap: str, topic_name: str) -> None:
    sent = produce_stream(bootstrap, topic_name, 3000, partitions=2, clients=60, duplicate_ratio=0.03, ledger=True)
    log = read_input_log(bootstrap, topic_name, sent)
    distinct = len(first_occurrences(log))
    for group in ("a", "b"):
        settings = settings_for(bootstrap, topic_name, group_id=f"{topic_name}-{group}", worker_id=group)
        worker = await run_worker_until(settings, "ledger", [0, 1], lambda w: w.stats.processed >= distinct,
                                        timeout_seconds=60)
        assert worker.stats.processed == distinct, f"group {group} handled {worker.stats.processed} of {distinct}"
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in read_topic(bootstrap, f"{topic_name}.processed", expect=2 * distinct):
        by_group[dict(m.headers())[GROUP_HEADER].decode()].append(orjson.loads(m.value()))
    assert sorted(by_group) == [f"{topic_name}-a", f"{topic_name}-b"]
    for group, processed in by_group.items():
        # Each group's ledger is its own: the second did not start from the first one's counters.
        check_all(log, processed, read_counts(bootstrap, topic_name, group, covering=sent), ledger=True)
