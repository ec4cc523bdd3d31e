"""Starting Spark for keyrange (`spark_session`), with the environment checked first (`environment`).

The aggregation job (`job`), `keyrange aggregate` and the benchmarks call `spark_session`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from keyrange.aggregation.connector import spark_jars_conf
from keyrange.aggregation.environment import check_environment

LOCAL_DRIVER_MEMORY = "2g"
"""Heap of a local session's JVM (driver and executor in one); `--conf spark.driver.memory=...`
overrides it."""


def spark_session(master: str | None = "local[2]", app_name: str = "keyrange-aggregate",
                  shuffle_partitions: int | None = None, extra_conf: dict[str, str] | None = None,
                  kafka_connector: bool = True) -> Any:
    """A SparkSession with Spark's Kafka connector on its classpath and the `keyrange-kafka`
    source registered.

    The connector's jars come from the tools folder or the image (`connector.spark_jars_conf`);
    with `kafka_connector` a missing connector is a SparkSetupError saying how to install it,
    without it (the embedded broker's reader needs none) it is added only when installed.

    Python workers use this interpreter unless PYSPARK_PYTHON says otherwise, so executors see
    the same keyrange and confluent-kafka as the driver. `master=None` keeps the master that
    spark-submit was given (the Spark Operator's cluster mode).
    """
    check_environment()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from keyrange.aggregation.kafka_datasource import register

    local = master is not None and master.startswith("local")
    if shuffle_partitions is None:
        shuffle_partitions = _local_cores(master or "") if local else 64
    builder = (
        SparkSession.builder.appName(app_name)
        # Few cores locally: the default 200 shuffle partitions would be 200 tiny tasks per batch.
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        # One Python worker process per core, reused by every task (a new one takes seconds to
        # start and connect back on a busy machine). Spark's default, stated because it matters.
        .config("spark.python.worker.reuse", "true")
        # Writing records partitioned by minute and batch would sort every task's rows by those
        # columns first; a few open writers per task (one per minute touched) need no sort.
        .config("spark.sql.maxConcurrentOutputFileWriters", "16")
        # Each micro-batch is cached for the few passes over it (bounded by the micro-batch cap)
        # and dropped after: compressing it costs CPU to save memory it has (BENCHMARKS.md).
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        # Spark's code cache is smaller than a micro-batch's generated classes: the next batch's
        # identical code would be evicted and compiled again (BENCHMARKS.md, Aggregation).
        .config("spark.sql.codegen.cache.maxEntries", "1000")
        # A set of minutes in a query as a hash set passed by reference, not one comparison per
        # value compiled into the generated code (new code whenever the minutes change).
        .config("spark.sql.optimizer.inSetConversionThreshold", "0")
    )
    if master is not None:
        builder = builder.master(master)
    if local:
        builder = (
            builder.config("spark.ui.enabled", "false")
            # Listing a few hundred local directories in the driver takes milliseconds; above the
            # default threshold (32 paths) Spark would run a Spark job to list them.
            .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "4096")
            # Adaptive execution re-plans after every shuffle (a job of its own per shuffle stage)
            # to coalesce or split partitions; with a couple of small partitions per batch there
            # is nothing to gain and the extra round trips cost seconds per micro-batch.
            .config("spark.sql.adaptive.enabled", "false")
            # In local mode the driver's JVM is the executor too: the default 1g heap spends a
            # micro-batch of a million cached records in garbage collection. Read before the JVM
            # starts (PySpark passes it to spark-submit).
            .config("spark.driver.memory", LOCAL_DRIVER_MEMORY)
        )
    extra_conf = extra_conf or {}
    # The classpath is fixed when the JVM starts: later sessions of this process get the same.
    # Under spark-submit (master None) the submitter's --jars, --packages or extraClassPath
    # may already bring the connector, which this process cannot see: add it only if installed.
    required = kafka_connector and master is not None
    extra_conf = {**extra_conf, **spark_jars_conf(extra_conf, required=required)}
    for key, value in extra_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # Parquet warns whenever several files are open at once in a task (one per minute a
    # micro-batch touches) and it shrinks their row groups to fit: expected here, not a problem.
    jvm: Any = spark.sparkContext._jvm
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.parquet.hadoop.MemoryManager", jvm.org.apache.logging.log4j.Level.ERROR)
    register(spark)
    return spark


def _local_cores(master: str) -> int:
    """Cores of a `local`, `local[N]` or `local[*]` master."""
    if "[" not in master:
        return 1  # plain `local` is one thread
    inside = master.partition("[")[2].rstrip("]").split(",")[0]
    if inside.isdigit():
        return max(1, int(inside))
    return os.cpu_count() or 2
