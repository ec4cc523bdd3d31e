"""The processed topic as a streaming DataFrame (`processed_stream`), from either of two readers.

`job` calls `processed_stream` with a `StreamSettings`; the CLI, the spec and the demo take the
reader names and defaults from here.

- `kafka` (the default): Spark's own Kafka connector, `spark.readStream.format("kafka")`. Offsets
  are found with Kafka's ListOffsets, records are read by the JVM, and `kafka.*` options carry the
  Kafka client properties (TLS, SASL). The reader for real Kafka clusters.
- `keyrange-kafka`: keyrange's Python data source (`kafka_datasource`), for the embedded broker (a
  tansu workaround: under read_committed tansu's ListOffsets answers 0 while a transaction is
  open, so the connector sees no records while a worker is mid-transaction; docs/aggregation.md).

Both give rows `topic, partition, offset, timestamp, key, value` with read_committed, honour
`startingOffsets` and a per-micro-batch cap, and keep their offsets in the streaming checkpoint,
so the job on top does not know which one it reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keyrange.errors import UserError
from keyrange.kafkaclients import java_client_properties

CONNECTOR = "kafka"
PYTHON_SOURCE = "keyrange-kafka"
SOURCES = (CONNECTOR, PYTHON_SOURCE)
DEFAULT_TRIGGER_SECONDS = 5.0
"""Seconds between a continuous aggregation's micro-batches unless told otherwise
(`--trigger-seconds`, `spec.aggregation.triggerSeconds`)."""
END_OF_RANGE_WAIT_MS = 10
"""The connector's `fetch.max.wait.ms` unless the client properties set one: each task's last fetch,
at its partition's end, finds nothing new and waits this long (the Java default, 500 ms, made
small micro-batches mostly waiting; BENCHMARKS.md, Aggregation). A backlog's fetches never wait."""


@dataclass(frozen=True)
class StreamSettings:
    """What to read and how (the same for both sources)."""

    bootstrap: str
    """Kafka bootstrap servers."""
    topic: str
    """The processed-record topic."""
    source: str = CONNECTOR
    """`kafka` (Spark's connector) or `keyrange-kafka` (the Python data source, for tansu)."""
    starting_offsets: str = "earliest"
    """Where a query without a checkpoint starts: `earliest`, `latest` or JSON like
    `{"topic": {"0": 42}}` (the connector's form; `keyrange-kafka` also takes `{"0": 42}`)."""
    max_records_per_batch: int | None = None
    """Cap on the offsets one micro-batch reads (None: everything available)."""
    client_properties: Mapping[str, str] = field(default_factory=dict)
    """Kafka client properties (e.g. security.protocol, sasl.*, ssl.*), passed as `kafka.<name>`."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise UserError(f"the aggregation source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        check_starting_offsets(self.starting_offsets, self.topic, self.source)
        if self.max_records_per_batch is not None and self.max_records_per_batch < 1:
            raise UserError(f"the micro-batch cap must be at least 1, got {self.max_records_per_batch}")


def check_starting_offsets(text: str, topic: str, source: str, option: str = "the starting offsets") -> None:
    """UserError naming `option` unless `text` is a start `source` takes (`StreamSettings.starting_offsets`):
    found here, not by Spark's connector once the query starts."""
    if text in ("earliest", "latest"):
        return
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and set(parsed) == {topic}:
        parsed = parsed[topic]
    elif source != PYTHON_SOURCE:
        parsed = None
    if not (isinstance(parsed, dict) and parsed
            and all(isinstance(p, str) and p.isdigit() for p in parsed)
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= -2 for o in parsed.values())):
        raise UserError(f"{option} must be earliest, latest or JSON like {json.dumps({topic: {'0': 42}})} "
                        f"(offsets per partition of {topic!r}; -2 earliest, -1 latest), got {text!r}")


def connector_options(settings: StreamSettings) -> dict[str, str]:
    """The options of Spark's Kafka source for `settings` (client properties in the Java client's names)."""
    options = {"kafka.fetch.max.wait.ms": str(END_OF_RANGE_WAIT_MS)}
    options.update({f"kafka.{k}": v for k, v in java_client_properties(settings.client_properties).items()})
    options.update({
        "kafka.bootstrap.servers": settings.bootstrap,
        "subscribe": settings.topic,
        # Aborted worker transactions never count; open ones wait for a later micro-batch.
        "kafka.isolation.level": "read_committed",
        "startingOffsets": settings.starting_offsets,
        # Records deleted by the topic's retention before they were aggregated fail the query
        # rather than silently missing from the aggregates.
        "failOnDataLoss": "true",
        "includeHeaders": "false",
    })
    if settings.max_records_per_batch:
        options["maxOffsetsPerTrigger"] = str(settings.max_records_per_batch)
    return options


def python_source_options(settings: StreamSettings) -> dict[str, str]:
    """The options of the `keyrange-kafka` source for `settings`."""
    options = {f"kafka.{k}": v for k, v in settings.client_properties.items()}
    options.update({"bootstrap": settings.bootstrap, "topic": settings.topic,
                    "startingOffsets": _per_partition(settings.starting_offsets, settings.topic)})
    if settings.max_records_per_batch:
        options["maxRecordsPerBatch"] = str(settings.max_records_per_batch)
    return options


def _per_partition(starting: str, topic: str) -> str:
    """The connector's `{"topic": {"0": 42}}` as keyrange-kafka's `{"0": 42}` (others unchanged)."""
    try:
        parsed = json.loads(starting)
    except ValueError:
        return starting
    if isinstance(parsed, dict) and isinstance(parsed.get(topic), dict):
        return json.dumps(parsed[topic])
    return starting


def processed_stream(spark: Any, settings: StreamSettings) -> Any:
    """The streaming DataFrame of the processed topic's records, from the chosen source."""
    if settings.source == CONNECTOR:
        fmt, options = "kafka", connector_options(settings)
    else:
        fmt, options = PYTHON_SOURCE, python_source_options(settings)
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()
