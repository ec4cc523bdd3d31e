"""Retention of the stored records (docs/aggregation.md, "Retention"), with real Spark.

Minutes wholly older than the horizon (newest `created` aggregated minus the retention period)
are deleted after a micro-batch; a record created before the horizon is late: never aggregated,
so a late re-delivery cannot count twice, and a replayed batch decides the same.
"""

from __future__ import annotations

from typing import Any

from keyrange.aggregation import read_results
from keyrange.aggregation.job import BatchAggregator
from keyrange.aggregation.reference import MINUTE_MS, Delivery, aggregate
from keyrange.aggregation.store import HadoopStorage
from tests.integration.aggregation_helpers import make_topic, processed_records, produce_processed
from tests.kafkatools import read_topic

T0 = 1_790_000_040_000 - 1_790_000_040_000 % MINUTE_MS


def _minute(k: int, count: int, seed: int) -> list[dict[str, Any]]:
    """`count` records created within minute T0 + k (kept inside it: 37 ms apart at most)."""
    records = processed_records(count, clients=8, seed=seed, start_ms=T0 + k * MINUTE_MS, first_offset=k * 1000)
    assert all(T0 + k * MINUTE_MS <= r["created"] < T0 + (k + 1) * MINUTE_MS for r in records)
    return records


def test_old_minutes_are_deleted_and_late_records_never_count(spark: Any, bootstrap: str, topic_name: str,
                                                               tmp_path: Any) -> None:
    make_topic(bootstrap, topic_name, 1)
    early = [r for k in range(5) for r in _minute(k, 300, seed=60 + k)]  # minutes 0..4
    n0 = len(produce_processed(bootstrap, topic_name, early, 1, per_transaction=len(early)))
    later = _minute(5, 300, seed=70)
    late_first_time = _minute(0, 1, seed=71)  # a new uuid, created in minute 0: late by then
    redelivered_late, redelivered_kept = early[0], early[-1]  # minutes 0 and 4
    n1 = len(produce_processed(bootstrap, topic_name,
                               [*later, redelivered_late, redelivered_kept, *late_first_time], 1,
                               per_transaction=1000))
    topic = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic_name)
             .option("kafka.isolation.level", "read_committed").load())
    output = str(tmp_path / "out")
    aggregator = BatchAggregator(spark, output, retention_minutes=2)

    aggregator(topic.where(f"offset < {n0 + 1}"), 0)  # the first transaction and its marker
    storage = HadoopStorage(spark, output)
    assert storage.record_minutes() == [T0 + k * MINUTE_MS for k in range(5)]
    assert aggregator.summary.late == 0

    second = topic.where(f"offset > {n0}")
    aggregator(second, 1)
    aggregator(second, 1)  # replayed after a crash: decides the same
    # The horizon was the newest `created` of batch 0 (minute 4) minus 2 minutes: minutes 0 to 1
    # lie wholly before it; minute 2 straddles it and stays.
    assert storage.record_minutes() == [T0 + k * MINUTE_MS for k in (2, 3, 4, 5)]
    s = aggregator.summary
    assert s.late == 2 * 2  # the minute-0 re-delivery and the late first delivery, in each run of batch 1
    assert s.aggregated == len(early) + 2 * len(later)  # batch 1 ran twice; the tables hold it once
    assert s.duplicates == 2 * 1  # the minute-4 re-delivery, deduplicated against the stored records

    deliveries = [Delivery(m.partition(), m.offset(), m.value()) for m in read_topic(bootstrap, topic_name, n0 + n1)]
    late_uuid = late_first_time[0]["uuid"]
    expected = aggregate([d for d in deliveries if late_uuid.encode() not in d.value])
    results = read_results(output)
    assert results.clients == expected["clients"]
    assert results.workers == expected["workers"]
    assert [w["events"] for w in results.windows] == [w["events"] for w in expected["windows"]] == [300] * 6
    assert results.manifest["highWaterMs"] == max(r["created"] for r in later)
