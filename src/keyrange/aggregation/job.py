"""The aggregation job: processed topic -> keyrange-kafka stream -> deduplicated Parquet aggregates.

One code path for both modes: a streaming query whose `foreachBatch` deduplicates by uuid and
merges each micro-batch into the stored tables (see `store` for the layout). `run_once` uses
Trigger.AvailableNow (everything there is now, then stop); `start_continuous` a processing-time
trigger. Either way the checkpoint holds the Kafka offsets already aggregated, so a rerun reads
only new records, and a replayed micro-batch rewrites the same outputs (each record counts once).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from keyrange.aggregation import store, tables
from keyrange.aggregation.session import spark_session
from keyrange.errors import UserError
from keyrange.kafkaio import partition_counts

CONNECT_BACK_ATTEMPTS = 3
"""Runs of `run_once` when Spark's Python worker fails to connect back in time (see there)."""


class AggregationError(UserError, RuntimeError):
    """The aggregation job could not start or failed; the message says why."""


@dataclass
class AggregationSummary:
    """What a run did (cumulative over the micro-batches of this run)."""

    output: str
    batches: int = 0
    records_read: int = 0
    """Records read from the topic (after read_committed)."""
    invalid: int = 0
    """Records that break the processed-record contract (skipped)."""
    duplicates: int = 0
    """Records whose uuid was already aggregated (counted once)."""
    aggregated: int = 0
    """New unique records added to the aggregates."""
    clients: int | None = None
    windows: int | None = None
    workers: int | None = None
    """Rows in the newest tables (counted when a run ends; None before)."""
    seconds: float = 0.0
    last_batch_id: int | None = None
    batch_seconds: list[float] = field(default_factory=list)

    def line(self) -> str:
        """One human-readable line."""
        text = (f"{self.batches} batches, {self.records_read:,} records read, {self.aggregated:,} aggregated, "
                f"{self.duplicates:,} duplicates, {self.invalid:,} invalid")
        if self.clients is not None:
            text += f"; {self.clients:,} clients, {self.windows:,} minute windows, {self.workers:,} workers"
        return f"{text} -> {self.output}"


ProgressCallback = Callable[[int, AggregationSummary], None]


class BatchAggregator:
    """The `foreachBatch` function: merges one micro-batch into the stored aggregates.

    Spark jobs per micro-batch with new records: one that reads the batch (into the cache) and
    counts it per minute, one that broadcasts the uuids stored earlier in those minutes (if any),
    one that deduplicates the batch and writes the new records, one per table.
    Stored Parquet is always read with a known schema: inferring one would cost a Spark job.
    """

    def __init__(self, spark: Any, output: str, progress: ProgressCallback | None = None) -> None:
        self._spark = spark
        self.root = store.normalize(output)
        self._storage = store.HadoopStorage(spark, self.root)
        self._progress = progress
        self.summary = AggregationSummary(self.root)

    def __call__(self, raw: Any, batch_id: int) -> None:
        """Deduplicate, store the new records, merge the three tables, publish the manifest."""
        began = time.monotonic()
        parsed = tables.parse_processed(raw).persist()
        try:
            counts = parsed.groupBy("valid", "minute").count().collect()
            read = sum(r["count"] for r in counts)
            invalid = sum(r["count"] for r in counts if not r["valid"])
            minutes = sorted({r["minute"] for r in counts if r["valid"]})
            added = self._add(parsed, batch_id, minutes) if minutes else 0
        finally:
            parsed.unpersist()
        s = self.summary
        s.batches += 1
        s.records_read += read
        s.invalid += invalid
        s.aggregated += added
        s.duplicates += read - invalid - added
        s.last_batch_id = batch_id
        s.batch_seconds.append(time.monotonic() - began)
        if self._progress:
            self._progress(batch_id, s)

    def _add(self, parsed: Any, batch_id: int, minutes: list[int]) -> int:
        """Store the batch's records not stored before and merge them into the tables; how many."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        fresh = tables.first_delivery(parsed.where("valid")).drop("valid")
        earlier = self._earlier_records(batch_id, minutes)
        if earlier is not None:
            earlier = earlier.persist()  # read by the dedup and again by the window recomputation
            fresh = fresh.join(earlier.select("uuid"), "uuid", "left_anti")
        fresh = fresh.persist()
        try:
            # Counted while written (no job of its own). One directory per batch id, overwritten
            # whole: a replay replaces exactly its files.
            written = Observation()
            (fresh.observe(written, F.count(F.lit(1)).alias("rows")).repartition("minute")
             .write.mode("overwrite").partitionBy("minute").parquet(f"{self.root}/records/batch={batch_id}"))
            added = int(written.get["rows"])
            if added:
                columns = ["minute", *tables.WINDOW_INPUT]
                touched = fresh.select(columns)
                if earlier is not None:
                    touched = earlier.select(columns).unionByName(touched)
                self._merge(fresh, touched, batch_id, minutes)
        finally:
            fresh.unpersist()
            if earlier is not None:
                earlier.unpersist()
        return added

    def _earlier_records(self, batch_id: int, minutes: list[int]) -> Any:
        """Records stored by earlier batches in `minutes` (None if there are none).

        A re-delivery repeats its original's `created`, hence its minute, so only those minute
        directories are listed and read, never the whole history.
        """
        paths = [path for batch, path in self._storage.record_partitions(minutes) if batch < batch_id]
        if not paths:
            return None
        return (self._spark.read.schema(tables.STORED_RECORD_COLUMNS)
                .option("basePath", f"{self.root}/records").parquet(*paths))

    def _merge(self, fresh: Any, touched: Any, batch_id: int, minutes: list[int]) -> None:
        client_partials = tables.client_partials(fresh)
        worker_partials = tables.worker_partials(fresh)
        recomputed = tables.window_stats(touched)
        stored = {
            "clients": self._stored("clients", batch_id, client_partials.schema),
            "workers": self._stored("workers", batch_id, tables.merge_workers(None, worker_partials).schema),
            "windows": self._stored("windows", batch_id, recomputed.schema),
        }
        new_tables = {
            "clients": tables.merge_clients(stored["clients"], client_partials),
            "workers": tables.merge_workers(stored["workers"], worker_partials),
            "windows": tables.merge_windows(stored["windows"], recomputed, minutes),
        }
        for name, df in new_tables.items():
            df.coalesce(1).write.mode("overwrite").parquet(store.table_path(self.root, name, batch_id))
        self._publish(batch_id)

    def _stored(self, table: str, batch_id: int, schema: Any) -> Any:
        """The newest version written before this batch (never this batch's own, on a replay)."""
        older = [v for v in self._storage.versions(table) if v < batch_id]
        if not older:
            return None
        for stale in older[:-1]:
            self._storage.delete(f"{table}/version={stale}")
        return self._spark.read.schema(schema).parquet(store.table_path(self.root, table, older[-1]))

    def _publish(self, batch_id: int) -> None:
        manifest = {
            "batch": batch_id,
            "versions": dict.fromkeys(store.TABLES, batch_id),
            "updatedAtMs": int(time.time() * 1000),
        }
        self._storage.write_text(store.MANIFEST, json.dumps(manifest, indent=2))

    def finish(self) -> AggregationSummary:
        """Count the rows of the newest tables into the summary (once per run, in one Spark job)."""
        from pyspark.sql import functions as F

        s = self.summary
        manifest = self._storage.read_text(store.MANIFEST)
        versions = json.loads(manifest)["versions"] if manifest else {}
        sizes = dict.fromkeys(store.TABLES, 0)
        # Every table has an `events` column: reading just that one needs no schema inference.
        frames = [self._spark.read.schema("events long").parquet(store.table_path(self.root, t, versions[t]))
                  .select(F.lit(t).alias("table")) for t in store.TABLES if t in versions]
        if frames:
            union = frames[0]
            for frame in frames[1:]:
                union = union.unionByName(frame)
            sizes.update({r["table"]: r["count"] for r in union.groupBy("table").count().collect()})
        s.clients, s.windows, s.workers = sizes["clients"], sizes["windows"], sizes["workers"]
        return s


def check_topic(bootstrap: str, topic: str) -> None:
    """Raise AggregationError unless `topic` exists (checked before Spark's slow start)."""
    if topic not in partition_counts(bootstrap):
        raise AggregationError(
            f"topic {topic!r} does not exist on {bootstrap}; it is the workers' sink topic "
            "(`<input topic>.processed` by default): start the workers first or pass the right --topic"
        )


def _stream(spark: Any, bootstrap: str, topic: str, max_records: int | None) -> Any:
    reader = spark.readStream.format("keyrange-kafka").option("bootstrap", bootstrap).option("topic", topic)
    if max_records:
        reader = reader.option("maxRecordsPerBatch", str(max_records))
    return reader.load()


def run_once(bootstrap: str, topic: str, output: str, checkpoint: str | None = None,
             master: str = "local[2]", spark: Any = None, progress: ProgressCallback | None = None,
             max_records_per_batch: int | None = 500_000) -> AggregationSummary:
    """Aggregate every record not aggregated before (per the checkpoint), then return.

    `checkpoint` defaults to `<output>/_checkpoint`; `spark` lets a caller reuse its session;
    a backlog is split into micro-batches of at most `max_records_per_batch`.
    """
    check_topic(bootstrap, topic)
    spark = spark or spark_session(master)
    root = store.normalize(output)
    aggregator = BatchAggregator(spark, root, progress)
    began = time.monotonic()
    for attempt in range(1, CONNECT_BACK_ATTEMPTS + 1):
        query = (_stream(spark, bootstrap, topic, max_records_per_batch).writeStream.foreachBatch(aggregator)
                 .option("checkpointLocation", store.normalize(checkpoint or f"{root}/_checkpoint"))
                 .trigger(availableNow=True).start())
        try:
            _await(query)
            break
        except AggregationError as exc:
            # Spark waits a fixed 10 s for a new Python process to connect back; on a saturated
            # machine that can run out. The checkpoint makes a rerun safe (nothing counts twice).
            if "failed to connect back" not in str(exc) or attempt == CONNECT_BACK_ATTEMPTS:
                raise
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
                     master: str = "local[2]", trigger_seconds: float = 5.0,
                     max_records_per_batch: int | None = 200_000, spark: Any = None,
                     progress: ProgressCallback | None = None) -> ContinuousAggregation:
    """Start a streaming aggregation that runs a micro-batch every `trigger_seconds`."""
    check_topic(bootstrap, topic)
    spark = spark or spark_session(master)
    root = store.normalize(output)
    aggregator = BatchAggregator(spark, root, progress)
    query = (_stream(spark, bootstrap, topic, max_records_per_batch).writeStream.foreachBatch(aggregator)
             .option("checkpointLocation", store.normalize(checkpoint or f"{root}/_checkpoint"))
             .trigger(processingTime=f"{trigger_seconds} seconds").start())
    return ContinuousAggregation(query, aggregator)


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
    for marker in ("KafkaReadError: ", "AggregationError: "):
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0]
    return text.splitlines()[0] if text else type(exc).__name__


def summary_dict(summary: AggregationSummary) -> dict[str, Any]:
    """The summary as JSON-ready data (without the per-batch timings)."""
    data = asdict(summary)
    data.pop("batch_seconds")
    return data
