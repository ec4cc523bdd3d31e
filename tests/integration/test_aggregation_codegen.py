"""A continuous aggregation's micro-batches reuse Spark's generated code (real Spark).

Spark compiles each query stage to Java, then the JVM compiles the hot parts again: for a small
micro-batch that is most of its cost. Code is reused only when it is the same text, so a value
that changes at every micro-batch (the batch id, an exact retention horizon) must never be
compiled into it; and the code cache must hold a whole micro-batch's classes.
"""

from __future__ import annotations

import json
from typing import Any

from keyrange.aggregation.job import BatchAggregator
from keyrange.aggregation.reference import MINUTE_MS
from tests.integration.aggregation_helpers import make_topic, processed_records, produce_processed

T0 = 1_790_000_040_000 - 1_790_000_040_000 % MINUTE_MS
PER_BATCH = 100


def _classes_compiled(spark: Any) -> int:
    return int(spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
               .getCount())


def test_a_micro_batch_like_the_one_before_compiles_no_new_code(spark: Any, bootstrap: str, topic_name: str,
                                                               tmp_path: Any) -> None:
    make_topic(bootstrap, topic_name, 1)
    for k in range(3):  # one transaction per micro-batch, all within minute T0 (4 s of it each)
        produce_processed(bootstrap, topic_name, processed_records(PER_BATCH, clients=8, seed=80 + k,
                                                                   start_ms=T0 + k * 4000, first_offset=k * 1000),
                          1, per_transaction=PER_BATCH)

    def batch(k: int) -> Any:
        # Offsets in the reader's options, not in a filter: a filter's numbers would be new code.
        first, end = k * (PER_BATCH + 1), (k + 1) * (PER_BATCH + 1)  # each transaction ends in a marker
        return (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic_name).option("kafka.isolation.level", "read_committed")
                .option("startingOffsets", json.dumps({topic_name: {"0": first}}))
                .option("endingOffsets", json.dumps({topic_name: {"0": end}})).load())

    aggregator = BatchAggregator(spark, str(tmp_path / "out"))
    aggregator(batch(0), 0)
    aggregator(batch(1), 1)  # the first batch with stored records to check against: new plans
    before = _classes_compiled(spark)
    aggregator(batch(2), 2)  # the same plans as batch 1, other data, batch id and high-water mark
    assert _classes_compiled(spark) - before == 0
    assert aggregator.summary.aggregated == 3 * PER_BATCH and aggregator.summary.duplicates == 0
