"""The aggregates as Spark DataFrame transformations: parse, summarise, merge.

Per client, per worker and per one-minute window (by the event's `created` time). Client and
worker figures are sums, minima and maxima, so a micro-batch's partial figures merge into the
stored ones. Percentiles do not merge, but histograms do: latency and handler times are whole
milliseconds, so each minute keeps how many records had each value (`histogram_partials`), a
micro-batch adds its counts to the stored ones of the minutes it touches, and those windows'
percentiles are recomputed from the merged counts (Spark's `percentile` with a frequency column:
exact, the same as over the values themselves, without re-reading a single stored record).

Percentiles are Spark's exact `percentile` (linear interpolation between closest ranks).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from keyrange.aggregation.reference import MINUTE_MS, PERCENTILES

# `result` is declared an object with an integer `value` (the ledger's): Spark's JSON reader gives
# null for any other shape (a number, a list, a non-integer `value`) without failing the rest of
# the row, the reference's rule, and with no second JSON parse of the result.
# `clientId` is read as text: Spark's JSON reader gives a number's own text (1042 -> "1042") and
# a string's value, so integer ids and text ids (spec.input, docs/input.md) group alike.
PROCESSED_SCHEMA = StructType([
    StructField("clientId", StringType()),
    StructField("uuid", StringType()),
    StructField("created", LongType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("worker", StringType()),
    StructField("startedAt", LongType()),
    StructField("finishedAt", LongType()),
    StructField("result", StructType([StructField("value", LongType())])),
])

STORED_UUIDS = "uuid string"
"""What is stored of each new record (partitioned by `minute` and `batch`): what deduplication
needs. Reading with this schema skips Spark's schema inference job."""
HISTOGRAM_SCHEMA = "minute long, metric string, value long, count long"
"""The stored histograms: per minute and metric, how many records had each value (ms)."""
LATENCY, HANDLER = "latency", "handler"
"""`metric` of a histogram row: created -> startedAt, startedAt -> finishedAt."""
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
        F.col("r.result.value").alias("ledger_value"),
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


_BY_CLIENT, _BY_WORKER, _BY_LATENCY, _BY_HANDLER = (["client_id"], ["worker"], ["minute", "latency"],
                                                    ["minute", "handler"])
_GROUPED = ["client_id", "worker", "minute", "latency", "handler"]


def _grouping_id(grouped: list[str]) -> int:
    """Spark's `grouping_id()` of a grouping set: one bit per column of _GROUPED, first column
    highest, set when the column is *not* grouped."""
    return sum(1 << (len(_GROUPED) - 1 - i) for i, name in enumerate(_GROUPED) if name not in grouped)


_POSITION_BITS = 41
"""An input position packed in one 64-bit integer for `batch_partials`: (partition + 1) above
this many bits, offset + 1 below (0 for a missing one; Kafka partitions below 2**22 and offsets
below 2**40 fit). Comparing the packed integers orders
positions as (partition, offset) with a missing field first, like Spark's order of structs, but
a long comparison costs far less than a struct's in an aggregation that sees every record."""


def _packed_position() -> Column:
    def plus_one(name: str) -> Column:
        return F.coalesce(F.col(name).cast("long") + 1, F.lit(0))

    return F.shiftleft(plus_one("input_partition"), _POSITION_BITS) + plus_one("input_offset")


def _unpacked(packed: Column) -> tuple[Column, Column]:
    partition = F.shiftright(packed, _POSITION_BITS)
    offset = packed.bitwiseAND(F.lit((1 << _POSITION_BITS) - 1))
    return (F.when(partition > 0, (partition - 1).cast("int")).alias("last_partition"),
            F.when(offset > 0, offset - 1).alias("last_offset"))


def batch_partials(records: DataFrame) -> DataFrame:
    """Every partial figure of a micro-batch in one aggregation, so its records are scanned once:
    per client, per worker, and per minute and latency / handler time (grouping sets, told apart
    by the `set` column). `client_partials`, `worker_partials` and `histogram_partials` split it."""
    position = F.col("position")
    return records.select(
        *_GROUPED[:3], (F.col("started_ms") - F.col("created_ms")).alias("latency"),
        (F.col("finished_ms") - F.col("started_ms")).alias("handler"),
        "created_ms", "finished_ms", "ledger_value", _packed_position().alias("position"),
    ).groupingSets([_BY_CLIENT, _BY_WORKER, _BY_LATENCY, _BY_HANDLER], *_GROUPED).agg(
        F.grouping_id().alias("set"),
        F.count(F.lit(1)).alias("events"),
        F.min("created_ms").alias("first_seen_ms"),
        F.max("created_ms").alias("last_seen_ms"),
        F.max_by("ledger_value", position).alias("ledger_value"),
        F.max(position).alias("_last"),
        F.sum("handler").alias("handler_ms_total"),
        F.min("finished_ms").alias("first_finished_ms"),
        F.max("finished_ms").alias("last_finished_ms"),
    )


def _of(partials: DataFrame, grouped: list[str]) -> DataFrame:
    return partials.where(F.col("set") == _grouping_id(grouped))


def client_partials(partials: DataFrame) -> DataFrame:
    """Per client: events, first/last seen (`created`), ledger value of the last event in log order."""
    return _of(partials, _BY_CLIENT).select(
        "client_id", "events", "first_seen_ms", "last_seen_ms", "ledger_value", *_unpacked(F.col("_last")))


def merge_clients(stored: DataFrame | None, partial: DataFrame) -> DataFrame:
    """Stored client rows combined with a micro-batch's partial rows."""
    if stored is None:
        return partial
    position = F.struct("last_partition", "last_offset")
    # Stores written before client ids were text hold them as integers: the same text once cast.
    stored = stored.withColumn("client_id", F.col("client_id").cast("string"))
    return stored.unionByName(partial).groupBy("client_id").agg(
        F.sum("events").alias("events"),
        F.min("first_seen_ms").alias("first_seen_ms"),
        F.max("last_seen_ms").alias("last_seen_ms"),
        F.max_by("ledger_value", position).alias("ledger_value"),
        F.max(position).alias("_last"),
    ).select("*", F.col("_last.last_partition").alias("last_partition"),
             F.col("_last.last_offset").alias("last_offset")).drop("_last")


def worker_partials(partials: DataFrame) -> DataFrame:
    """Per worker: events, total handler time, first/last finish."""
    return _of(partials, _BY_WORKER).select("worker", "events", "handler_ms_total", "first_finished_ms",
                                            "last_finished_ms")


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


def histogram_partials(partials: DataFrame) -> DataFrame:
    """Per minute and metric (LATENCY, HANDLER): how many records have each value (HISTOGRAM_SCHEMA)."""
    # One selection, not a union of two: Spark does not find the kept partials in the second
    # branch of a union of a DataFrame with itself, and would aggregate the whole batch again.
    latency = F.col("set") == _grouping_id(_BY_LATENCY)
    return partials.where(latency | (F.col("set") == _grouping_id(_BY_HANDLER))).select(
        "minute", F.when(latency, F.lit(LATENCY)).otherwise(F.lit(HANDLER)).alias("metric"),
        F.when(latency, F.col("latency")).otherwise(F.col("handler")).alias("value"),
        F.col("events").alias("count"))


def merge_histograms(stored: DataFrame | None, partial: DataFrame, minutes: list[Any],
                     horizon_ms: int | None) -> DataFrame:
    """The stored histograms with a micro-batch's counts added to the `minutes` it touches, without
    the minutes wholly before the retention horizon (their windows are final; see `retention`)."""
    if stored is None:
        merged = partial
    else:
        touched = F.col("minute").isin(minutes)
        added = (stored.where(touched).unionByName(partial).groupBy("minute", "metric", "value")
                 .agg(F.sum("count").alias("count")))
        merged = stored.where(~touched).unionByName(added)
    if horizon_ms is not None:
        merged = merged.where(F.col("minute") + MINUTE_MS > F.lit(horizon_ms))
    return merged


def _percentile_columns(metric: str, prefix: str) -> list[Column]:
    value = F.when(F.col("metric") == metric, F.col("value").cast("double"))  # null rows are skipped
    p = F.percentile(value, F.array(*[F.lit(q) for q in PERCENTILES]), F.col("count"))
    return [p[i].alias(f"{prefix}_p{round(q * 100)}_ms") for i, q in enumerate(PERCENTILES)]


def window_stats(histograms: DataFrame, minutes: list[Any]) -> DataFrame:
    """The windows of `minutes` from their merged histograms: events and p50/p95/p99 of latency
    (created -> started) and of handler time (started -> finished)."""
    return histograms.where(F.col("minute").isin(minutes)).groupBy("minute").agg(
        F.sum(F.when(F.col("metric") == LATENCY, F.col("count"))).alias("events"),
        *_percentile_columns(LATENCY, "latency"),
        *_percentile_columns(HANDLER, "handler"),
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
