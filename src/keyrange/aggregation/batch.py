"""The `foreachBatch` function: one micro-batch of processed records merged into the stored tables.

Spark jobs per micro-batch with new records:
1. read the batch from Kafka into the cache, parse it, and bring each record's key (status,
   minute, uuid, sink position) back to the driver as Arrow (the one Kafka read);
2. if earlier batches stored records in the minutes it touches: read their uuids (a scan, no
   shuffle); the driver finds the duplicates (`dedup`, vectorized) and the batch drops their sink
   positions with a broadcast anti-join on one 64-bit key, so rows are never shuffled for
   deduplication;
3. two passes over the cache, together: the new records' uuids written, and one aggregation
   (grouping sets) computing every table's partial figures, kept (one row per client, worker and
   histogram bucket);
4. four writes from those partials, started together so that their small jobs overlap on the
   cores: new versions of the clients, workers, histograms and windows tables (each merged with
   its stored version; a window's percentiles from its histograms).
Stored Parquet is always read with a known schema: inferring one would cost a Spark job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from keyrange.aggregation import dedup, retention, store, tables
from keyrange.errors import UserError

SMALL_BATCH = 100_000
"""New records below which a micro-batch writes its uuids in one task (one file per minute)."""


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
        """Deduplicate, store the new records, merge the tables, publish the manifest."""
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
                              minutes, horizon) if minutes else 0
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

    def _add(self, valid: Any, keys: pa.Table, batch_id: int, minutes: list[int], horizon: int | None) -> int:
        """Store the batch's records not stored before and merge them into the tables; how many."""
        from pyspark.sql import functions as F

        winners, added = dedup.deduplicate(keys, self._earlier_uuids(batch_id, minutes))
        if not added:
            return 0
        fresh = self._first_deliveries(valid, dedup.copies_to_drop(keys, winners))
        # One directory per minute and batch id, and only those directories are overwritten
        # (dynamic partition overwrite): a replay replaces exactly its own files. One task per
        # core rather than per Kafka partition (one in all for a small batch): a few larger files
        # per minute, cheaper to write now and to list and read back for later batches.
        writers = 1 if added < SMALL_BATCH else self._spark.sparkContext.defaultParallelism
        # The batch id as a string: Spark compiles a number into the generated code (new code to
        # compile and JIT at every batch) but passes a string by reference; the directory name,
        # `batch=<id>`, is the same either way.
        records = (fresh.select("minute", F.lit(str(batch_id)).alias("batch"), "uuid").coalesce(writers)
                   .write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
                   .partitionBy("minute", "batch"))
        # Every table's partial figures in one pass over the cached batch, kept (they are small:
        # one row per client, worker and histogram bucket) for the four table writes.
        partials = tables.batch_partials(fresh).persist()
        try:
            # Each write is a small Spark job with fixed costs (planning, committing, renaming
            # files) that leave the cores idle: run together, they overlap. The partials are
            # computed once, beside the records' write, before the table writes read them.
            with ThreadPoolExecutor(5) as pool:
                started = [pool.submit(records.parquet, f"{self.root}/{store.RECORDS}")]
                partials.count()
                for name, df in self._merged_tables(partials, batch_id, minutes, horizon).items():
                    started.append(pool.submit(df.coalesce(1).write.mode("overwrite").parquet,
                                               store.table_path(self.root, name, batch_id)))
                for future in started:
                    future.result()
        finally:
            partials.unpersist()
        return added

    def _first_deliveries(self, valid: Any, duplicates: pa.Array) -> Any:
        """`valid` without the records at the packed sink positions `duplicates` (a broadcast
        anti-join on one 64-bit key: cheaper than matching uuids)."""
        from pyspark.sql import functions as F

        if not len(duplicates):
            return valid
        drop = F.broadcast(self._spark.createDataFrame(pa.table({"dropped": duplicates})))
        position = F.shiftleft(valid["sink_partition"].cast("long"), dedup.OFFSET_BITS) + valid["sink_offset"]
        return valid.join(drop, position == drop["dropped"], "left_anti")

    def _earlier_uuids(self, batch_id: int, minutes: list[int]) -> pa.ChunkedArray | None:
        """The uuids stored by earlier batches in `minutes` (None if there are none).

        A re-delivery repeats its original's `created`, hence its minute, so only those minute
        directories are listed and read, never the whole history.
        """
        paths = [path for batch, path in self._storage.record_partitions(minutes) if batch < batch_id]
        if not paths:
            return None
        return (self._spark.read.schema(tables.STORED_UUIDS).option("basePath", f"{self.root}/{store.RECORDS}")
                .parquet(*paths).select("uuid").toArrow()["uuid"])

    def _merged_tables(self, partials: Any, batch_id: int, minutes: list[int], horizon: int | None) -> dict[str, Any]:
        """The new version of each table: the stored one (before this batch) merged with the
        batch's `partials` (`tables.batch_partials`)."""
        client_partials = tables.client_partials(partials)
        worker_partials = tables.worker_partials(partials)
        stored_clients = self._stored("clients", batch_id, client_partials.schema)
        stored_histograms = self._stored(store.HISTOGRAMS, batch_id, tables.HISTOGRAM_SCHEMA)
        if stored_clients is not None and stored_histograms is None:
            raise UserError(f"{self.root} was written by an older keyrange that kept no histograms, so its "
                            "windows cannot be extended: aggregate into a new --output (and its checkpoint)")
        histograms = tables.merge_histograms(stored_histograms, tables.histogram_partials(partials), minutes,
                                            horizon)
        recomputed = tables.window_stats(histograms, minutes)
        return {
            "clients": tables.merge_clients(stored_clients, client_partials),
            "workers": tables.merge_workers(
                self._stored("workers", batch_id, tables.merge_workers(None, worker_partials).schema),
                worker_partials),
            "windows": tables.merge_windows(self._stored("windows", batch_id, recomputed.schema), recomputed,
                                            minutes),
            store.HISTOGRAMS: histograms,
        }

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
