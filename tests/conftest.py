"""Fixtures shared by every tier: the brokers and unique topic names.

Brokers (each started once per session, and only if a test asks for it):
- `broker` / `bootstrap`: the embedded tansu broker.
- `kafka_broker` / `kafka_bootstrap`: Apache Kafka, one KRaft node.
- `broker_engine` / `any_bootstrap`: parametrized over both ("tansu", "kafka"), for the guarantee
  tests that must hold on either; `broker_engine.engine` says which one a test runs on.
- `kafka_cluster3`: a 3-node Apache Kafka cluster for fault tests (replication factor 3,
  min.insync.replicas 2). Kill, pause or restart its nodes freely: after each test every node is
  resumed or restarted and the cluster serves again.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.local.kafka_cluster import QUICK_START_JVM_OPTIONS, KafkaCluster
from tests.kafka_cluster_helpers import heal
from tests.kafkaretry import wait_for_group_coordinator
from tests.parallel import (  # noqa: F401 - the hooks: heavy fixtures' xdist groups, and their early stop
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_runtest_teardown,
    stopped_after_its_last_test,
)
from tests.timeouts import SESSION_TEARDOWN_SECONDS, last_test_allowance

pytest_runtest_protocol = last_test_allowance(SESSION_TEARDOWN_SECONDS)

QUICK_JVM_OPTIONS = " ".join(QUICK_START_JVM_OPTIONS)
"""JDK_JAVA_OPTIONS for every JVM the tests start (Spark's drivers, in this process and under
`keyrange aggregate` or the demo; the Kafka nodes have it already): the quick compiler only, as a
test's short run never reaches the optimising compiler's pay-off, and the suite is bound by CPU
(BENCHMARKS.md)."""
os.environ.setdefault("JDK_JAVA_OPTIONS", QUICK_JVM_OPTIONS)

_names = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """One embedded tansu broker for the whole session (in-memory; tests use unique topics)."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def bootstrap(broker: EmbeddedBroker) -> str:
    """Bootstrap address of the session broker."""
    return broker.bootstrap


IDLE_QUIET_KAFKA = {"metadata.max.idle.interval.ms": "5000"}
"""The session node's controller appends its no-op metadata record every 5 s, not every 0.5 s: most
of what a node costs while it waits between tests. Clients never see these records."""


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaCluster]:
    """One Apache Kafka node (KRaft) for the whole session; tests use unique topics."""
    with KafkaCluster(nodes=1, jvm_options=QUICK_START_JVM_OPTIONS, broker_config=IDLE_QUIET_KAFKA) as cluster:
        wait_for_group_coordinator(cluster.bootstrap)
        yield cluster


@pytest.fixture
def kafka_bootstrap(kafka_broker: KafkaCluster) -> str:
    """Bootstrap address of the session's Apache Kafka node."""
    return kafka_broker.bootstrap


@dataclass(frozen=True)
class BrokerUnderTest:
    """Which broker a parametrized test runs on, and where it is."""

    engine: str
    """"tansu" or "kafka"."""
    bootstrap: str


@pytest.fixture(params=["tansu", "kafka"])
def broker_engine(request: pytest.FixtureRequest) -> BrokerUnderTest:
    """The test runs once on tansu and once on Apache Kafka (ids "tansu" / "kafka")."""
    if request.param == "tansu":
        return BrokerUnderTest("tansu", request.getfixturevalue("broker").bootstrap)
    return BrokerUnderTest("kafka", request.getfixturevalue("kafka_broker").bootstrap)


@pytest.fixture
def any_bootstrap(broker_engine: BrokerUnderTest) -> str:
    """Bootstrap address of the parametrized broker (see `broker_engine`)."""
    return broker_engine.bootstrap


@pytest.fixture(scope="session")
def _kafka_cluster3_session(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    # Fault tests restart nodes under load: on 2 busy shared cores a restarted node was measured
    # taking over 90 s to serve again (it replays the metadata log while starved of CPU); this
    # bounds a hang, the wait itself is for the node to answer.
    with KafkaCluster(nodes=3, jvm_options=QUICK_START_JVM_OPTIONS, start_timeout_seconds=240.0) as cluster, \
            stopped_after_its_last_test(request, cluster.stop):
        wait_for_group_coordinator(cluster.bootstrap)
        yield cluster


@pytest.fixture
def kafka_cluster3(_kafka_cluster3_session: KafkaCluster) -> Iterator[KafkaCluster]:
    """The session's 3-node Apache Kafka cluster, healed after the test (see the module docstring)."""
    yield _kafka_cluster3_session
    heal(_kafka_cluster3_session)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (tansu auto-creates unknown topics, so names never repeat)."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    return f"{base}-{os.getpid()}-{next(_names)}"
