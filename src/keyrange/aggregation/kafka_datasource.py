"""`keyrange-kafka`: keyrange's Spark Python data source for Kafka topics (`KafkaDataSource`).

The aggregation reads the processed topic with it on the embedded broker (`processed_stream`
chooses it, `session.spark_session` registers it in every session): there Spark's own connector
finds no records while a transaction is open (docs/aggregation.md). The Kafka reads themselves
are in `partition_reads`; this module is the Spark side: options, offsets, planning, Arrow rows.
Rows look like Spark's Kafka source: `topic, partition, offset, timestamp, key, value`.

Options: `bootstrap` and `topic` (required); `startingOffsets` (`earliest` | `latest` | JSON
`{"0": 42}`); `endingOffsets` for batch reads (`latest` | JSON); `maxRecordsPerBatch` for
streaming; `isolationLevel` (`read_committed`); `readTimeoutSeconds`; any `kafka.<name>` is passed
to librdkafka. Streaming offsets are `{"<partition>": <next offset>}`, so a query restarted from
its checkpoint continues where the last committed micro-batch ended and each record is read by
exactly one micro-batch. Each Kafka partition of a batch is one Spark partition, read in parallel.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from keyrange.aggregation.partition_reads import EndProbe, KafkaReadError, ReaderSettings, read_range

FORMAT = "keyrange-kafka"
SCHEMA = "topic string, partition int, offset long, timestamp timestamp, key binary, value binary"

_ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),  # what Spark's TimestampType maps to
    ("key", pa.binary()),
    ("value", pa.binary()),
])


class OffsetRange(InputPartition):
    """One Kafka partition's records `[start, end)`: one Spark task."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def settings_from_options(options: Mapping[str, str]) -> ReaderSettings:
    """Parse the source options; raise KafkaReadError naming a missing or bad option."""
    lowered = {k.lower(): v for k, v in options.items()}
    for required in ("bootstrap", "topic"):
        if not lowered.get(required):
            raise KafkaReadError(f"the {FORMAT} source needs the option {required!r}")
    extra = {k[len("kafka."):]: v for k, v in options.items() if k.lower().startswith("kafka.")}
    try:
        timeout = float(lowered.get("readtimeoutseconds", "120"))
    except ValueError:
        raise KafkaReadError(f"readTimeoutSeconds must be a number, got {lowered['readtimeoutseconds']!r}") from None
    isolation = lowered.get("isolationlevel", "read_committed")
    if isolation not in ("read_committed", "read_uncommitted"):
        raise KafkaReadError(f"isolationLevel must be read_committed or read_uncommitted, got {isolation!r}")
    return ReaderSettings(lowered["bootstrap"], lowered["topic"], isolation, timeout, extra=extra)


def parse_offsets(text: str, option: str) -> dict[int, int] | None:
    """`{"0": 42}` -> {0: 42}; `earliest`/`latest` -> None (resolved against the broker)."""
    if text in ("earliest", "latest"):
        return None
    try:
        raw = json.loads(text)
        return {int(p): int(o) for p, o in raw.items()}
    except (ValueError, AttributeError, TypeError):
        raise KafkaReadError(
            f"{option} must be 'earliest', 'latest' or JSON like {{\"0\": 42}}, got {text!r}"
        ) from None


def to_spark_offset(offsets: Mapping[int, int]) -> dict[str, int]:
    """Spark offsets must be JSON objects with string keys."""
    return {str(p): o for p, o in sorted(offsets.items())}


def from_spark_offset(offset: Mapping[str, Any]) -> dict[int, int]:
    """The inverse of `to_spark_offset`."""
    return {int(p): int(o) for p, o in offset.items()}


def plan_ranges(start: Mapping[int, int], end: Mapping[int, int]) -> list[OffsetRange]:
    """One OffsetRange per partition that has records between `start` and `end`."""
    return [OffsetRange(p, start.get(p, 0), e) for p, e in sorted(end.items()) if e > start.get(p, 0)]


def cap_ends(start: Mapping[int, int], end: Mapping[int, int], max_records: int) -> dict[int, int]:
    """Limit a micro-batch to about `max_records`, shared evenly by the partitions with a backlog.

    Offsets count transaction markers too, so the cap is on offsets, slightly above records.
    """
    backlog = {p: e - start.get(p, 0) for p, e in end.items() if e > start.get(p, 0)}
    if not backlog:
        return dict(end)
    share = max(1, max_records // len(backlog))
    return {p: (start.get(p, 0) + min(backlog[p], share)) if p in backlog else e for p, e in end.items()}


def record_batches(settings: ReaderSettings, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one OffsetRange (Arrow keeps the Python-to-JVM hop cheap)."""
    for chunk in read_range(settings, part.partition, part.start, part.end):
        n = len(chunk.offsets)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([settings.topic] * n, pa.string()),
                pa.array([chunk.partition] * n, pa.int32()),
                pa.array(chunk.offsets, pa.int64()),
                pa.array(chunk.timestamps_ms, pa.timestamp("ms", tz="UTC")).cast(_ARROW_SCHEMA.field(3).type),
                pa.array(chunk.keys, pa.binary()),
                pa.array(chunk.values, pa.binary()),
            ],
            schema=_ARROW_SCHEMA,
        )


class KafkaBatchReader(DataSourceReader):
    """Reads `startingOffsets` .. `endingOffsets` (resolved once, when the query is planned)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._settings = settings_from_options(options)
        lowered = {k.lower(): v for k, v in options.items()}
        probe = EndProbe(self._settings)
        try:
            starting = parse_offsets(lowered.get("startingoffsets", "earliest"), "startingOffsets")
            ending = parse_offsets(lowered.get("endingoffsets", "latest"), "endingOffsets")
            self._start = starting if starting is not None else probe.low_offsets()
            self._end = ending if ending is not None else probe.ends(self._start)
        finally:
            probe.close()

    def partitions(self) -> Sequence[InputPartition]:
        """One Spark partition per Kafka partition with records in range."""
        return plan_ranges(self._start, self._end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one partition range."""
        if not isinstance(partition, OffsetRange):  # Spark's placeholder when nothing was planned
            return iter(())
        return record_batches(self._settings, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over partition offsets; the end of each is found by `EndProbe`.

    With Trigger.AvailableNow the ends found by the first `latestOffset` call are the target:
    later records wait for the next run, and `maxRecordsPerBatch` still splits the work.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self._settings = settings_from_options(options)
        lowered = {k.lower(): v for k, v in options.items()}
        self._starting = lowered.get("startingoffsets", "earliest")
        parse_offsets(self._starting, "startingOffsets")  # fail at start, not at the first batch
        raw_max = lowered.get("maxrecordsperbatch")
        try:
            self._max_records = int(raw_max) if raw_max else None
        except ValueError:
            raise KafkaReadError(f"maxRecordsPerBatch must be an integer, got {raw_max!r}") from None
        if self._max_records is not None and self._max_records < 1:
            raise KafkaReadError(f"maxRecordsPerBatch must be at least 1, got {self._max_records}")
        self._end_probe: EndProbe | None = None
        self._available_now = False
        self._target: dict[int, int] | None = None

    @property
    def _probe(self) -> EndProbe:
        # Created on first use in the driver: Spark pickles this reader to ship `read` to tasks,
        # and a live Kafka consumer cannot be pickled (nor is it needed there).
        if self._end_probe is None:
            self._end_probe = EndProbe(self._settings)
        return self._end_probe

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the driver-side probe."""
        return {**self.__dict__, "_end_probe": None}

    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts (a restarted one starts from its checkpoint instead)."""
        explicit = parse_offsets(self._starting, "startingOffsets")
        if explicit is not None:
            return to_spark_offset(explicit)
        lows = self._probe.low_offsets()
        if self._starting == "earliest":
            return to_spark_offset(lows)
        return to_spark_offset(self._probe.ends(lows))

    def getDefaultReadLimit(self) -> ReadLimit:
        """`maxRecordsPerBatch` if set (ignored by Trigger.AvailableNow)."""
        return ReadMaxRows(self._max_records) if self._max_records else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the end at what the first `latestOffset` call finds (the checkpoint's start is
        not known yet here, and probing from offset 0 would read the whole topic)."""
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        """The end of the next micro-batch: the committed end of every partition, capped."""
        begin = from_spark_offset(start)
        if self._available_now:
            if self._target is None:
                self._target = self._probe.ends(begin)
            ends = {p: max(e, begin.get(p, 0)) for p, e in self._target.items()}
        else:
            ends = self._probe.ends(begin)
        for p in ends:  # partitions added since the query started begin at 0
            begin.setdefault(p, 0)
        if isinstance(limit, ReadMaxRows):
            ends = cap_ends(begin, ends, limit.max_rows)
        return to_spark_offset(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One Spark partition per Kafka partition with records in the micro-batch."""
        return plan_ranges(from_spark_offset(start), from_spark_offset(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one partition range (runs in a Spark task)."""
        if not isinstance(partition, OffsetRange):  # Spark's placeholder when nothing was planned
            return iter(())
        return record_batches(self._settings, partition)

    def stop(self) -> None:
        """Close the probe's consumer."""
        if self._end_probe is not None:
            self._end_probe.close()
            self._end_probe = None


class KafkaDataSource(DataSource):
    """The `keyrange-kafka` format: `spark.readStream.format("keyrange-kafka")`."""

    @classmethod
    def name(cls) -> str:
        """The format name to use in `spark.read.format(...)`."""
        return FORMAT

    def schema(self) -> str:
        """Rows like Spark's own Kafka source."""
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """Batch reads."""
        return KafkaBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Streaming reads."""
        return KafkaStreamReader(self.options)


def register(spark: Any) -> None:
    """Make `keyrange-kafka` available in a SparkSession."""
    spark.dataSource.register(KafkaDataSource)
