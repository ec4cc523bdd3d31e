"""`keyrange aggregate`: the PySpark job that turns processed records into Parquet aggregates.

    keyrange aggregate --bootstrap B --topic events.processed --output out/agg --once
    keyrange aggregate --bootstrap B --topic events.processed --output out/agg --continuous

Spark is imported only here, so the rest of the CLI works without the `spark` extra.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from types import FrameType
from typing import Any

from keyrange.aggregation.processed_stream import (
    CONNECTOR,
    DEFAULT_TRIGGER_SECONDS,
    SOURCES,
    check_starting_offsets,
)
from keyrange.aggregation.retention import DEFAULT_MINUTES
from keyrange.commands.kafkaargs import add_kafka_arguments, kafka_properties
from keyrange.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange aggregate`."""
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--topic", required=True, help="the processed-record topic (e.g. events.processed)")
    parser.add_argument("--output", required=True, help="directory or URL for the Parquet aggregates")
    parser.add_argument("--checkpoint", help="streaming checkpoint (default: OUTPUT/_checkpoint)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", dest="continuous", action="store_false",
                      help="aggregate what is there now, then exit (the default)")
    mode.add_argument("--continuous", dest="continuous", action="store_true",
                      help="keep aggregating new records until interrupted")
    parser.set_defaults(continuous=False)
    parser.add_argument("--master", default="local[*]",
                        help="Spark master: local[*] (default), local[N], k8s://https://HOST:PORT, "
                             "or spark-submit (keep the master spark-submit was given)")
    parser.add_argument("--trigger-seconds", type=float, default=DEFAULT_TRIGGER_SECONDS,
                        help="with --continuous: seconds between micro-batches (default 5)")
    parser.add_argument("--max-records-per-batch", type=int, default=None,
                        help="cap on the offsets one micro-batch reads (default: 2000000 with --once, "
                             "200000 with --continuous)")
    parser.add_argument("--source", choices=SOURCES, default=CONNECTOR,
                        help="kafka: Spark's own Kafka connector (the default); keyrange-kafka: keyrange's "
                             "Python reader, for the embedded broker (tansu), whose ListOffsets answers 0 "
                             "while a transaction is open")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="where a new checkpoint starts: earliest (default), latest, or JSON like "
                             '{"events.processed": {"0": 42}}')
    parser.add_argument("--retention-minutes", type=int, default=DEFAULT_MINUTES,
                        help="keep the stored records this long in event time for deduplication; older "
                             f"records are late and skipped (default {DEFAULT_MINUTES}; 0 keeps all forever)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration, repeatable (e.g. spark.executor.instances=2)")
    parser.add_argument("--json", action="store_true", help="print the final summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no per-batch progress lines")
    add_kafka_arguments(parser)


def _pairs(pairs: list[str], flag: str) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{flag} takes KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value
    return conf


def run(args: argparse.Namespace) -> int:
    """Run the job once or continuously; print progress to stderr and a summary at the end."""
    if args.trigger_seconds <= 0:
        raise UserError(f"--trigger-seconds must be positive, got {args.trigger_seconds}")
    if args.max_records_per_batch is not None and args.max_records_per_batch < 1:
        raise UserError(f"--max-records-per-batch must be at least 1, got {args.max_records_per_batch}")
    if args.retention_minutes < 0:
        raise UserError(f"--retention-minutes must be 0 (forever) or more, got {args.retention_minutes}")
    conf = _pairs(args.conf, "--conf")
    check_starting_offsets(args.starting_offsets, args.topic, args.source, "--starting-offsets")
    reading: dict[str, Any] = {"source": args.source, "starting_offsets": args.starting_offsets,
               "client_properties": kafka_properties(args),
               "retention_minutes": args.retention_minutes}
    if args.max_records_per_batch is not None:
        reading["max_records_per_batch"] = args.max_records_per_batch
    from keyrange.aggregation.environment import check_environment

    check_environment()
    from keyrange.aggregation import job
    from keyrange.aggregation.session import spark_session

    def progress(batch_id: int, summary: job.AggregationSummary) -> None:
        if not args.quiet:
            print(f"batch {batch_id}: {summary.line()}", file=sys.stderr, flush=True)

    job.check_topic(args.bootstrap, args.topic, reading["client_properties"])  # before paying for Spark's start
    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # a caller's session is the caller's to stop
    spark = spark_session(None if args.master == "spark-submit" else args.master, extra_conf=conf,
                          kafka_connector=args.source == CONNECTOR)
    try:
        if args.continuous:
            summary = _run_continuous(args, spark, progress, reading)
        else:
            summary = job.run_once(args.bootstrap, args.topic, args.output, args.checkpoint,
                                   spark=spark, progress=progress, **reading)
    finally:
        if owned:
            spark.stop()
    if args.json:
        print(json.dumps(job.summary_dict(summary), indent=2))
    else:
        print(summary.line() if summary.batches else f"nothing new to aggregate -> {summary.output}")
    return 0


def _run_continuous(args: argparse.Namespace, spark: Any, progress: Any, reading: dict[str, Any]) -> Any:
    from keyrange.aggregation import job

    running = job.start_continuous(args.bootstrap, args.topic, args.output, args.checkpoint,
                                   trigger_seconds=args.trigger_seconds, spark=spark, progress=progress,
                                   **reading)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # SIGTERM (Kubernetes) and Ctrl-C stop the query; a micro-batch cut short is re-run from the
    # checkpoint at the next start, and its outputs are idempotent, so nothing counts twice.
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.is_set() and running.query.isActive:
            stop.wait(1.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return running.stop()  # raises if the query failed
