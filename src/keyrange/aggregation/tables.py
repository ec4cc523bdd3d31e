"""The aggregates as Spark DataFrame transformations: parse, deduplicate, summarise, merge.

Per client, per worker and per one-minute window (by the event's `created` time). Client and
worker figures are sums, minima and maxima, so a micro-batch's partial figures merge into the
stored ones. Percentiles do not merge, so a window touched by a micro-batch is recomputed from the
stored deduplicated records of that minute (the records table is partitioned by minute, so that
read is pruned to the minutes touched).

Percentiles are Spark's exact `percentile` (linear interpolation between closest ranks).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from keyrange.aggregation.reference import MINUTE_MS, PERCENTILES

# `result` is declared a string: Spark's JSON reader then keeps any JSON value (the ledger's
# object, another handler's number or list) as its JSON text instead of failing the row.
PROCESSED_SCHEMA = StructType([
    StructField("clientId", LongType()),
    StructField("uuid", StringType()),
    StructField("created", LongType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("worker", StringType()),
    StructField("startedAt", LongType()),
    StructField("finishedAt", LongType()),
    StructField("result", StringType()),
])

WINDOW_INPUT = ["created_ms", "started_ms", "finished_ms"]
"""The record columns `window_stats` reads, besides `minute`."""
RECORD_COLUMNS = ["uuid", *WINDOW_INPUT]
"""What is stored of each new record: what deduplication and the window recomputation need."""
STORED_RECORD_COLUMNS = "uuid string, created_ms long, started_ms long, finished_ms long, minute long, batch long"
"""The stored records' schema (`minute` and `batch` are partition directories); reading with it
skips Spark's schema inference job."""
KEY_COLUMNS = ["status", "minute", "created_ms", "uuid", "sink_partition", "sink_offset"]
"""What the driver gets back of every record of a micro-batch (counts, minutes, deduplication)."""
FRESH, LATE, INVALID = "fresh", "late", "invalid"
STATUSES = (FRESH, LATE, INVALID)
"""`status` of a parsed record: to aggregate (if not a duplicate), older than the retention
horizon, or breaking the wire contract."""


def parse_processed(raw: DataFrame, horizon_ms: int | None = None) -> DataFrame:
    """Kafka rows -> one typed row per processed record, with its `status`: INVALID if it breaks
    the wire contract (not JSON, or no clientId/uuid/created/startedAt/finishedAt), LATE if it
    was created before `horizon_ms` (see `retention`), else FRESH."""
    parsed = F.from_json(F.col("value").cast("string"), PROCESSED_SCHEMA)
    rec = raw.select(
        parsed.alias("r"),
        F.col("partition").alias("sink_partition"),
        F.col("offset").alias("sink_offset"),
    )
    required = ["clientId", "uuid", "created", "startedAt", "finishedAt"]
    valid = F.col("r").isNotNull()
    for name in required:
        valid = valid & F.col(f"r.{name}").isNotNull()
    return rec.select(
        F.col("r.clientId").alias("client_id"),
        F.col("r.uuid").alias("uuid"),
        F.col("r.created").alias("created_ms"),
        F.col("r.partition").alias("input_partition"),
        F.col("r.offset").alias("input_offset"),
        F.col("r.worker").alias("worker"),
        F.col("r.startedAt").alias("started_ms"),
        F.col("r.finishedAt").alias("finished_ms"),
        F.get_json_object(F.col("r.result"), "$.value").cast("long").alias("ledger_value"),
        (F.col("r.created") - F.col("r.created") % MINUTE_MS).alias("minute"),
        "sink_partition",
        "sink_offset",
        _status(F.coalesce(valid, F.lit(False)), horizon_ms).alias("status"),
    )


def _status(valid: Column, horizon_ms: int | None) -> Column:
    status = F.when(~valid, F.lit(INVALID))
    if horizon_ms is not None:
        status = status.when(F.col("r.created") < F.lit(horizon_ms), F.lit(LATE))
    return status.otherwise(F.lit(FRESH))


def client_partials(records: DataFrame) -> DataFrame:
    """Per client: events, first/last seen (`created`), ledger value of the last event in log order."""
    position = F.struct("input_partition", "input_offset")
    return records.groupBy("client_id").agg(
        F.count(F.lit(1)).alias("events"),
        F.min("created_ms").alias("first_seen_ms"),
        F.max("created_ms").alias("last_seen_ms"),
        F.max_by("ledger_value", position).alias("ledger_value"),
        F.max(position).alias("_last"),
    ).select("*", F.col("_last.input_partition").alias("last_partition"),
             F.col("_last.input_offset").alias("last_offset")).drop("_last")


def merge_clients(stored: DataFrame | None, partial: DataFrame) -> DataFrame:
    """Stored client rows combined with a micro-batch's partial rows."""
    if stored is None:
        return partial
    position = F.struct("last_partition", "last_offset")
    return stored.unionByName(partial).groupBy("client_id").agg(
        F.sum("events").alias("events"),
        F.min("first_seen_ms").alias("first_seen_ms"),
        F.max("last_seen_ms").alias("last_seen_ms"),
        F.max_by("ledger_value", position).alias("ledger_value"),
        F.max(position).alias("_last"),
    ).select("*", F.col("_last.last_partition").alias("last_partition"),
             F.col("_last.last_offset").alias("last_offset")).drop("_last")


def worker_partials(records: DataFrame) -> DataFrame:
    """Per worker: events, total handler time, first/last finish."""
    return records.groupBy("worker").agg(
        F.count(F.lit(1)).alias("events"),
        F.sum(F.col("finished_ms") - F.col("started_ms")).alias("handler_ms_total"),
        F.min("finished_ms").alias("first_finished_ms"),
        F.max("finished_ms").alias("last_finished_ms"),
    )


def merge_workers(stored: DataFrame | None, partial: DataFrame) -> DataFrame:
    """Stored worker rows combined with a micro-batch's partial rows; adds the mean handler time."""
    merged = partial if stored is None else stored.drop("handler_ms_mean").unionByName(partial).groupBy(
        "worker").agg(
        F.sum("events").alias("events"),
        F.sum("handler_ms_total").alias("handler_ms_total"),
        F.min("first_finished_ms").alias("first_finished_ms"),
        F.max("last_finished_ms").alias("last_finished_ms"),
    )
    return merged.withColumn("handler_ms_mean", F.col("handler_ms_total") / F.col("events"))


def _percentile_columns(value: Column, prefix: str) -> list[Column]:
    p = F.percentile(value, F.array(*[F.lit(q) for q in PERCENTILES]))
    return [p[i].alias(f"{prefix}_p{round(q * 100)}_ms") for i, q in enumerate(PERCENTILES)]


def window_stats(records: DataFrame) -> DataFrame:
    """Per minute of `created`: events and p50/p95/p99 of latency (created -> started) and of
    handler time (started -> finished), from every record of those minutes."""
    latency = (F.col("started_ms") - F.col("created_ms")).cast("double")
    handler = (F.col("finished_ms") - F.col("started_ms")).cast("double")
    return records.groupBy("minute").agg(
        F.count(F.lit(1)).alias("events"),
        *_percentile_columns(latency, "latency"),
        *_percentile_columns(handler, "handler"),
    ).select(
        F.col("minute").alias("window_start_ms"),
        (F.col("minute") + MINUTE_MS).alias("window_end_ms"),
        "*",
    ).drop("minute")


def merge_windows(stored: DataFrame | None, recomputed: DataFrame, minutes: list[Any]) -> DataFrame:
    """Stored windows with the recomputed minutes replaced."""
    if stored is None:
        return recomputed
    return stored.where(~F.col("window_start_ms").isin(minutes)).unionByName(recomputed)
