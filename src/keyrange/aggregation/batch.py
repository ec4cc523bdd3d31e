"""The `foreachBatch` function: one micro-batch of processed records merged into the stored tables.

Spark jobs per micro-batch with new records:
1. read the batch from Kafka into the cache, parse it, and bring each record's key (status,
   minute, uuid, sink position) back to the driver as Arrow (the one Kafka read);
2. if earlier batches stored records in the minutes it touches: read their uuids (a scan, no
   shuffle); the driver finds the duplicates (`dedup`, vectorized) and the batch drops them with a
   broadcast join, so rows are never shuffled for deduplication;
3. write the new records' uuid and timings, counting them as they are written;
4. one job per table (clients, workers, windows).
Stored Parquet is always read with a known schema: inferring one would cost a Spark job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from keyrange.aggregation import dedup, retention, store, tables


@dataclass
class AggregationSummary:
    """What a run did (cumulative over the micro-batches of this run)."""

    output: str
    batches: int = 0
    records_read: int = 0
    """Records read from the topic (after read_committed)."""
    invalid: int = 0
    """Records that break the processed-record contract (skipped)."""
    late: int = 0
    """Valid records older than the retention horizon when read (skipped; see `retention`)."""
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
        if self.late:
            text += f", {self.late:,} late"
        if self.clients is not None:
            text += f"; {self.clients:,} clients, {self.windows:,} minute windows, {self.workers:,} workers"
        return f"{text} -> {self.output}"


ProgressCallback = Callable[[int, AggregationSummary], None]


class BatchAggregator:
    """Merges each micro-batch into the stored aggregates (see the module docstring)."""

    def __init__(self, spark: Any, output: str, progress: ProgressCallback | None = None,
                 retention_minutes: int = retention.DEFAULT_MINUTES) -> None:
        self._spark = spark
        self.root = store.normalize(output)
        self._storage = store.HadoopStorage(spark, self.root)
        self._progress = progress
        self._retention = retention.Retention(retention_minutes)
        self.summary = AggregationSummary(self.root)

    def __call__(self, raw: Any, batch_id: int) -> None:
        """Deduplicate, store the new records, merge the three tables, publish the manifest."""
        from pyspark.sql import functions as F

        began = time.monotonic()
        manifest = store.Manifest.read(self._storage)
        high_water = manifest.high_water_before(batch_id)
        horizon = self._retention.horizon_ms(high_water)
        parsed = tables.parse_processed(raw, horizon).persist()
        try:
            # The one job that reads Kafka: it fills the cache and brings each record's key back.
            keys = parsed.select(*tables.KEY_COLUMNS).toArrow()
            by_status = {s: 0 for s in tables.STATUSES} | dedup.status_counts(keys["status"])
            fresh_keys = keys.filter(pc.equal(keys["status"], tables.FRESH))
            minutes = sorted(pc.unique(fresh_keys["minute"]).to_pylist())
            newest = pc.max(fresh_keys["created_ms"]).as_py()
            added = self._add(parsed.where(F.col("status") == tables.FRESH), fresh_keys, batch_id,
                              minutes) if minutes else 0
        finally:
            parsed.unpersist()
        if added:
            manifest.publish(self._storage, batch_id, newest if high_water is None else max(high_water, newest or 0))
        self._retention.apply(self._storage, horizon)
        s = self.summary
        s.batches += 1
        s.records_read += sum(by_status.values())
        s.invalid += by_status[tables.INVALID]
        s.late += by_status[tables.LATE]
        s.aggregated += added
        s.duplicates += by_status[tables.FRESH] - added
        s.last_batch_id = batch_id
        s.batch_seconds.append(time.monotonic() - began)
        if self._progress:
            self._progress(batch_id, s)

    def _add(self, valid: Any, keys: pa.Table, batch_id: int, minutes: list[int]) -> int:
        """Store the batch's records not stored before and merge them into the tables; how many."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        earlier = self._earlier_records(batch_id, minutes)
        earlier_uuids = None
        if earlier is not None:
            earlier = earlier.persist()  # read by the dedup and again by the window recomputation
            earlier_uuids = earlier.select("uuid").toArrow()["uuid"]
        try:
            fresh = self._first_deliveries(valid, dedup.duplicate_winners(keys, earlier_uuids))
            # Counted while written (no job of its own). One directory per minute and batch id,
            # and only those directories are overwritten (dynamic partition overwrite): a replay
            # replaces exactly its own files.
            # One task per core rather than per Kafka partition: a few larger files per minute,
            # cheaper to write now and to list and read back for later batches.
            written = Observation()
            (fresh.select("minute", F.lit(batch_id).alias("batch"), *tables.RECORD_COLUMNS)
             .coalesce(self._spark.sparkContext.defaultParallelism)
             .observe(written, F.count(F.lit(1)).alias("rows"))
             .write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("minute", "batch")
             .parquet(f"{self.root}/{store.RECORDS}"))
            added = int(written.get["rows"])
            if added:
                touched = fresh.select("minute", *tables.WINDOW_INPUT)
                if earlier is not None:
                    touched = earlier.select("minute", *tables.WINDOW_INPUT).unionByName(touched)
                self._merge(fresh, touched, batch_id, minutes)
        finally:
            if earlier is not None:
                earlier.unpersist()
        return added

    def _first_deliveries(self, valid: Any, winners: pa.Table) -> Any:
        """`valid` without the copies of uuids delivered before (earlier in this batch, or stored)."""
        from pyspark.sql import functions as F

        if not winners.num_rows:
            return valid
        kept = valid.join(F.broadcast(self._spark.createDataFrame(winners)), "uuid", "left")
        first = (F.col("win_partition") == F.col("sink_partition")) & (F.col("win_offset") == F.col("sink_offset"))
        return kept.where(F.col("win_partition").isNull() | first).drop("win_partition", "win_offset")

    def _earlier_records(self, batch_id: int, minutes: list[int]) -> Any:
        """Records stored by earlier batches in `minutes` (None if there are none).

        A re-delivery repeats its original's `created`, hence its minute, so only those minute
        directories are listed and read, never the whole history.
        """
        paths = [path for batch, path in self._storage.record_partitions(minutes) if batch < batch_id]
        if not paths:
            return None
        return (self._spark.read.schema(tables.STORED_RECORD_COLUMNS)
                .option("basePath", f"{self.root}/{store.RECORDS}").parquet(*paths))

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

    def _stored(self, table: str, batch_id: int, schema: Any) -> Any:
        """The newest version written before this batch (never this batch's own, on a replay)."""
        older = [v for v in self._storage.versions(table) if v < batch_id]
        if not older:
            return None
        for stale in older[:-1]:
            self._storage.delete(f"{table}/version={stale}")
        return self._spark.read.schema(schema).parquet(store.table_path(self.root, table, older[-1]))

    def finish(self) -> AggregationSummary:
        """Count the rows of the newest tables into the summary (once per run, in one Spark job)."""
        from pyspark.sql import functions as F

        s = self.summary
        versions = store.Manifest.read(self._storage).versions
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
