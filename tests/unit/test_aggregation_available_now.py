"""run_available_now: an availableNow query starts again only when Spark's Python worker failed
to connect back, at most CONNECT_BACK_ATTEMPTS times (no Spark: queries are stand-ins that fail
the way Spark's do, since a real one connects back in time on a quiet machine)."""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from keyrange.aggregation.job import CONNECT_BACK_ATTEMPTS, AggregationError, run_available_now

CONNECT_BACK = "[STREAM_FAILED] terminated with exception: Python worker failed to connect back. SQLSTATE: XXKST"


class Query:
    def __init__(self, failure: str | None) -> None:
        self.failure = failure

    def awaitTermination(self, timeout: float | None = None) -> None:  # Spark's name
        if self.failure:
            raise StreamingQueryException(message=self.failure)


def starter(*failures: str | None) -> tuple[list[Query], object]:
    started: list[Query] = []

    def start() -> Query:
        started.append(Query(failures[len(started)]))
        return started[-1]

    return started, start


def test_a_query_whose_python_worker_failed_to_connect_back_runs_again_until_it_ends():
    started, start = starter(CONNECT_BACK, CONNECT_BACK, None)
    run_available_now(start)
    assert len(started) == 3


def test_connect_back_failures_stop_after_the_last_attempt_with_the_reason():
    started, start = starter(*[CONNECT_BACK] * CONNECT_BACK_ATTEMPTS)
    with pytest.raises(AggregationError, match="failed to connect back"):
        run_available_now(start)
    assert len(started) == CONNECT_BACK_ATTEMPTS


def test_any_other_failure_is_raised_at_once():
    started, start = starter("[STREAM_FAILED] KafkaReadError: topic 'x' does not exist", None)
    with pytest.raises(AggregationError, match="topic 'x' does not exist"):
        run_available_now(start)
    assert len(started) == 1
