"""The aggregation job: processed topic -> Kafka stream (`sources`) -> deduplicated Parquet aggregates.

One code path for both modes: a streaming query whose `foreachBatch` (`batch.BatchAggregator`)
deduplicates by uuid and merges each micro-batch into the stored tables (see `store` for the
layout, `retention` for how long records are kept). `run_once` uses
Trigger.AvailableNow (everything there is now, then stop); `start_continuous` a processing-time
trigger. Either way the checkpoint holds the Kafka offsets already aggregated, so a rerun reads
only new records, and a replayed micro-batch rewrites the same outputs (each record counts once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from keyrange.aggregation import retention, store
from keyrange.aggregation.batch import AggregationSummary, BatchAggregator, ProgressCallback
from keyrange.aggregation.processed_stream import CONNECTOR, DEFAULT_TRIGGER_SECONDS, StreamSettings, processed_stream
from keyrange.aggregation.session import spark_session
from keyrange.errors import UserError
from keyrange.kafkaio import partition_counts

__all__ = ["AggregationError", "AggregationSummary", "BatchAggregator", "ContinuousAggregation", "ProgressCallback",
           "check_topic", "run_available_now", "run_once", "start_continuous", "summary_dict"]

ONCE_BATCH_CAP = 2_000_000
"""Default micro-batch cap of `run_once`: every micro-batch pays fixed costs (its Spark jobs, and
reading back the stored uuids of the minutes it touches, which for a backlog's re-deliveries is
most of them), so a backlog is read in as few as memory allows: 2M records cache in ~300 MB of
the executors' heap, and their keys take ~150 MB on the driver."""
CONTINUOUS_BATCH_CAP = 200_000
"""Default micro-batch cap of `start_continuous` (small batches keep a catching-up query fresh)."""
CONNECT_BACK_ATTEMPTS = 3
"""Runs of `run_once` when Spark's Python worker fails to connect back in time (see there)."""


class AggregationError(UserError, RuntimeError):
    """The aggregation job could not start or failed; the message says why."""


def check_topic(bootstrap: str, topic: str, client_properties: Mapping[str, str] | None = None) -> None:
    """Raise AggregationError unless `topic` exists (checked before Spark's slow start)."""
    if topic not in partition_counts(bootstrap, client_properties=client_properties):
        raise AggregationError(
            f"topic {topic!r} does not exist on {bootstrap}; it is the workers' sink topic "
            "(`<input topic>.processed` by default): start the workers first or pass the right --topic"
        )


def _settings(bootstrap: str, topic: str, source: str, max_records: int | None, starting_offsets: str,
              client_properties: Mapping[str, str] | None) -> StreamSettings:
    return StreamSettings(bootstrap, topic, source, starting_offsets, max_records, dict(client_properties or {}))


def _session(spark: Any, master: str, source: str) -> Any:
    """The caller's session, or a new one (the connector's jars are required only to use it)."""
    return spark or spark_session(master, kafka_connector=source == CONNECTOR)


def run_once(bootstrap: str, topic: str, output: str, checkpoint: str | None = None,
             master: str = "local[2]", spark: Any = None, progress: ProgressCallback | None = None,
             max_records_per_batch: int | None = ONCE_BATCH_CAP, source: str = CONNECTOR,
             starting_offsets: str = "earliest", client_properties: Mapping[str, str] | None = None,
             retention_minutes: int = retention.DEFAULT_MINUTES) -> AggregationSummary:
    """Aggregate every record not aggregated before (per the checkpoint), then return.

    `checkpoint` defaults to `<output>/_checkpoint`; `spark` lets a caller reuse its session;
    a backlog is split into micro-batches of at most `max_records_per_batch`. `source` picks the
    reader (`sources.SOURCES`); `starting_offsets` applies to a new checkpoint only;
    `client_properties` are Kafka client properties (TLS, SASL); `retention_minutes` is how long
    (in event time) the stored records are kept for deduplication (0: forever; see `retention`).
    """
    settings = _settings(bootstrap, topic, source, max_records_per_batch, starting_offsets, client_properties)
    check_topic(bootstrap, topic, client_properties)
    spark = _session(spark, master, source)
    root = store.normalize(output)
    aggregator = BatchAggregator(spark, root, progress, retention_minutes)
    began = time.monotonic()
    run_available_now(lambda: processed_stream(spark, settings).writeStream.foreachBatch(aggregator)
                      .option("checkpointLocation", store.normalize(checkpoint or f"{root}/_checkpoint"))
                      .trigger(availableNow=True).start())
    aggregator.summary.seconds = time.monotonic() - began
    return aggregator.finish()


class ContinuousAggregation:
    """A running continuous aggregation; `stop()` ends it (a micro-batch cut short is re-run
    from the checkpoint at the next start)."""

    def __init__(self, query: Any, aggregator: BatchAggregator) -> None:
        self.query = query
        self.aggregator = aggregator

    @property
    def summary(self) -> AggregationSummary:
        """Cumulative figures so far."""
        return self.aggregator.summary

    def wait(self, timeout_seconds: float | None = None) -> None:
        """Block until the query ends (or the timeout); raise AggregationError if it failed."""
        _await(self.query, timeout_seconds)

    def stop(self) -> AggregationSummary:
        """Stop the query (the checkpoint keeps every completed micro-batch); the final summary.

        Raises AggregationError if the query had failed."""
        self.query.stop()
        failure = self.query.exception()
        if failure is not None:
            raise AggregationError(f"the aggregation query failed: {_first_line(failure)}")
        return self.aggregator.finish()


def start_continuous(bootstrap: str, topic: str, output: str, checkpoint: str | None = None,
                     master: str = "local[2]", trigger_seconds: float = DEFAULT_TRIGGER_SECONDS,
                     max_records_per_batch: int | None = CONTINUOUS_BATCH_CAP, spark: Any = None,
                     progress: ProgressCallback | None = None, source: str = CONNECTOR,
                     starting_offsets: str = "earliest", client_properties: Mapping[str, str] | None = None,
                     retention_minutes: int = retention.DEFAULT_MINUTES) -> ContinuousAggregation:
    """Start a streaming aggregation that runs a micro-batch every `trigger_seconds` (the other
    arguments as for `run_once`)."""
    settings = _settings(bootstrap, topic, source, max_records_per_batch, starting_offsets, client_properties)
    check_topic(bootstrap, topic, client_properties)
    spark = _session(spark, master, source)
    root = store.normalize(output)
    aggregator = BatchAggregator(spark, root, progress, retention_minutes)
    query = (processed_stream(spark, settings).writeStream.foreachBatch(aggregator)
             .option("checkpointLocation", store.normalize(checkpoint or f"{root}/_checkpoint"))
             .trigger(processingTime=f"{trigger_seconds} seconds").start())
    return ContinuousAggregation(query, aggregator)


def run_available_now(start: Callable[[], Any], timeout_seconds: float | None = None) -> None:
    """Run the availableNow query that `start()` starts to its end, starting it again (up to
    CONNECT_BACK_ATTEMPTS runs) when Spark's Python worker failed to connect back.

    Spark waits a fixed 10 s for a new Python process to connect back; on a saturated machine that
    can run out. The query's checkpoint makes a rerun safe: it resumes after its last batch."""
    for attempt in range(1, CONNECT_BACK_ATTEMPTS + 1):
        try:
            _await(start(), timeout_seconds)
            return
        except AggregationError as exc:
            if "failed to connect back" not in str(exc) or attempt == CONNECT_BACK_ATTEMPTS:
                raise


def _await(query: Any, timeout_seconds: float | None = None) -> None:
    from pyspark.errors import StreamingQueryException

    try:
        if timeout_seconds is None:
            query.awaitTermination()
        else:
            query.awaitTermination(timeout_seconds)
    except StreamingQueryException as exc:
        raise AggregationError(f"the aggregation query failed: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("KafkaReadError: ", "AggregationError: ", "UserError: "):
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0]
    return text.splitlines()[0] if text else type(exc).__name__


def summary_dict(summary: AggregationSummary) -> dict[str, Any]:
    """The summary as JSON-ready data (without the per-batch timings)."""
    data = asdict(summary)
    data.pop("batch_seconds")
    return data
