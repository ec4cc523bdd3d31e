"""The integration tier: the embedded broker, worker processes, real Spark, Prometheus and Alertmanager.

Fixtures here serve several modules: the Spark session of the aggregation tests, and a Kafka node of
a test's own for the outage tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keyrange.local.kafka_cluster import QUICK_START_JVM_OPTIONS, KafkaCluster
from tests.integration.aggregation_helpers import require_pyspark
from tests.timeouts import tier_timeout

TIMEOUT_SECONDS = 300
"""Rescale and SIGKILL tests take minutes on a busy 2-core machine; slower ones set their own."""

pytest_collection_modifyitems = tier_timeout(Path(__file__).parent, TIMEOUT_SECONDS)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared local[2] SparkSession with Spark's Kafka connector and the keyrange-kafka source.

    One session serves every test that asks: local[2] costs ~5.5 s and ~630 MiB to start.
    """
    require_pyspark()
    # Spark's Python workers must run this very interpreter (same pyspark, same keyrange).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from keyrange.aggregation.session import spark_session

    session = spark_session("local[2]", app_name="keyrange-tests")
    yield session
    session.stop()


@pytest.fixture
def own_kafka() -> Iterator[KafkaCluster]:
    """A single Apache Kafka node for this test alone, to stop, freeze or restart under it."""
    with KafkaCluster(nodes=1, jvm_options=QUICK_START_JVM_OPTIONS) as cluster:
        yield cluster
