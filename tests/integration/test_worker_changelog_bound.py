"""A restore reads a bounded stretch of the keyed-state changelog, however long the consumer ran.

Scaled down: snapshots are due after a few dozen records instead of thousands, and the search for
the newest totals record starts with 50 records, so a few hundred commits make a changelog many
times longer than what a restore may read. Full scale: benchmarks/bench_restore.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import Message
from confluent_kafka.admin import ConfigResource

from keyrange.kafkaio import admin_client
from keyrange.logend import Span
from keyrange.worker import WorkerSettings, snapshots
from keyrange.worker.logreader import LogReader
from keyrange.worker.restore import RestoredPartition, restore_with
from keyrange.worker.snapshots import CHANGELOG_TOPIC_CONFIG
from tests.checkers import Counts, check_counts, first_occurrences, ledger_oracle
from tests.integration.worker_helpers import produce_stream, run_worker_until, settings_for
from tests.kafkatools import offsets_committed_so_far, read_input_log, read_topic

CLIENTS = 20
FLOOR = 10
SEARCH = 50


class CountingReader(LogReader):
    """A LogReader that counts the records it hands back, per topic."""

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__(settings)
        self.records: Counter[str] = Counter()

    def read(self, starts: dict[Span, int], stops: dict[Span, int] | None = None,
             each: Callable[[Span, list[Message]], None] | None = None, follow: int = 0
             ) -> tuple[dict[Span, list[Message]], dict[Span, int]]:
        if each is None:
            logs, ends = super().read(starts, stops, follow=follow)
            for (topic, _), messages in logs.items():
                self.records[topic] += len(messages)
            return logs, ends
        take = each

        def counted(span: Span, messages: list[Message]) -> None:
            self.records[span[0]] += len(messages)
            take(span, messages)

        return super().read(starts, stops, each=counted, follow=follow)


def restore_counting(settings: WorkerSettings) -> tuple[RestoredPartition, CountingReader]:
    """Restore partition 0 from its committed offset, counting what the restore read."""
    reader = CountingReader(settings)
    try:
        start = reader.start_offsets(settings.topic, [0])
        counts = {settings.topic: 1, settings.sink: 1, settings.dlq: 1, settings.state: 1}
        return restore_with(reader, settings, start, counts, None)[0], reader
    finally:
        reader.close()


async def test_a_restore_reads_a_bounded_stretch_of_a_long_changelog_and_restores_it_exactly(
        any_bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap = any_bootstrap  # on tansu and on Apache Kafka
    monkeypatch.setattr(snapshots, "SNAPSHOT_FLOOR", FLOOR)
    monkeypatch.setattr(snapshots, "SEARCH_FIRST_RECORDS", SEARCH)
    sent = produce_stream(bootstrap, topic_name, 3000, partitions=1, clients=CLIENTS, duplicate_ratio=0.05,
                          ledger=True)
    log = read_input_log(bootstrap, topic_name, sent)
    # A commit every few events, over two owners: the second restores from the first one's snapshot.
    settings = settings_for(bootstrap, topic_name, commit_interval_ms=1, concurrency=2, handler_config={"delayMs": 2})

    def committed_past(n: int) -> Callable[[object], bool]:
        return lambda _worker: offsets_committed_so_far(bootstrap, topic_name, settings.group_id, [0])[0] >= n

    await run_worker_until(settings, "ledger", [0], committed_past(sent // 2))
    await run_worker_until(settings, "ledger", [0], committed_past(sent))

    written = len(read_topic(bootstrap, settings.state))
    restored, reader = restore_counting(settings)
    # The snapshot's states and totals record, up to a snapshot interval and a transaction after
    # it, and what the search read back from the end.
    bound = SEARCH + snapshots.SNAPSHOT_EVERY * (CLIENTS + FLOOR) + 2 * (CLIENTS + 1)
    assert written > 3 * bound, f"the changelog holds only {written} records: too short to show a bound"
    read = reader.records[settings.state]
    assert read <= bound, f"the restore read {read} of the changelog's {written} records (bound {bound})"

    # Exactly what a read of the whole changelog gives: each client's ledger counter after its
    # last event, and the totals.
    assert restored.start_offset == sent
    oracle = ledger_oracle(log)
    last = {e.client_id: oracle[e.uuid]["value"] for e in first_occurrences(log)}
    assert restored.state == last
    totals = restored.totals
    check_counts(log, Counts(totals.handled, totals.dead_lettered, totals.duplicates_dropped))

    # The worker created the changelog so that Kafka's compaction can run (not that the bound needs it).
    resource = ConfigResource("topic", settings.state)
    admin = admin_client(bootstrap)  # kept: a future of a collected client fails
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["segment.ms"].value == CHANGELOG_TOPIC_CONFIG["segment.ms"]
