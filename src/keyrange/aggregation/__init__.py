"""Aggregating processed records with Spark (see docs/aggregation.md).

The Python API for other parts (e.g. `keyrange demo`):

    summary = run_once(bootstrap, "events.processed", "out/agg")   # AggregationSummary
    results = read_results("out/agg")                              # AggregateResults, no Spark

`run_once` and `start_continuous` need the `spark` extra (pyspark, pyarrow), Java and Spark's
Kafka connector (`connector`); they raise `SparkSetupError` saying what to install. Spark is
imported only when they are called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keyrange.aggregation.environment import SparkSetupError, check_environment
from keyrange.aggregation.store import AggregateResults, read_results

if TYPE_CHECKING:
    from keyrange.aggregation.job import AggregationSummary, ContinuousAggregation

__all__ = [
    "AggregateResults",
    "AggregationSummary",
    "ContinuousAggregation",
    "SparkSetupError",
    "read_results",
    "run_once",
    "start_continuous",
]


def run_once(bootstrap: str, topic: str, output: str, checkpoint: str | None = None,
             master: str = "local[2]", **kwargs: Any) -> AggregationSummary:
    """Aggregate every processed record not aggregated yet into Parquet under `output`."""
    check_environment()
    from keyrange.aggregation import job

    return job.run_once(bootstrap, topic, output, checkpoint, master, **kwargs)


def start_continuous(bootstrap: str, topic: str, output: str, checkpoint: str | None = None,
                     master: str = "local[2]", **kwargs: Any) -> ContinuousAggregation:
    """Start the streaming aggregation (a micro-batch every `trigger_seconds`)."""
    check_environment()
    from keyrange.aggregation import job

    return job.start_continuous(bootstrap, topic, output, checkpoint, master, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("AggregationSummary", "ContinuousAggregation"):
        from keyrange.aggregation import job

        return getattr(job, name)
    raise AttributeError(f"module 'keyrange.aggregation' has no attribute {name!r}")
