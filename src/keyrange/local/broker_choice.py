"""Which broker `keyrange run` and `keyrange demo` start when no bootstrap servers are given.

Apache Kafka, one KRaft node (`KafkaCluster`), where Java 17+ and the broker's jars are installed
(`make kafka`); else tansu (`EmbeddedBroker`), which needs neither. tansu did not hold the kata's
load for an hour (BENCHMARKS.md, "The embedded broker over an hour"), so it is the fallback for
machines without Java and a quick broker for short runs and tests, not the default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.local.kafka_cluster import KafkaCluster
from keyrange.local.kafka_setup import KafkaInstall, KafkaSetupMissing, find_kafka

Engine = Literal["kafka", "tansu"]
ENGINES: tuple[Engine, ...] = ("kafka", "tansu")

TANSU_USE = "tansu suits short runs: it did not hold an hour of the kata's load (BENCHMARKS.md)"


class LocalBroker(Protocol):
    """A broker on 127.0.0.1 that this process starts and stops."""

    def start(self) -> str:
        """Start it, wait until it serves, return its bootstrap address."""
        ...

    def stop(self) -> None:
        """Stop it; its data goes with it."""
        ...

    def is_running(self) -> bool:
        """True while its process is alive."""
        ...


@dataclass(frozen=True)
class BrokerChoice:
    """The broker to start, and the line that tells the user which one and why."""

    engine: Engine
    notice: str
    """One line: which broker, why, and (falling back to tansu) how to get Apache Kafka."""

    def broker(self) -> LocalBroker:
        """A new, unstarted broker of this engine on a free port."""
        if self.engine == "kafka":
            return KafkaCluster(nodes=1)
        return EmbeddedBroker()


def choose_broker(requested: Engine | None, find: Callable[[], KafkaInstall] = find_kafka) -> BrokerChoice:
    """The embedded broker for `--engine requested` (None: Apache Kafka where `find` finds Java
    and the jars, else tansu). An explicit kafka that `find` cannot satisfy is a KafkaSetupMissing
    naming what is missing and the fix."""
    if requested == "tansu":
        return BrokerChoice("tansu", f"embedded broker: tansu (--engine tansu); {TANSU_USE}")
    try:
        install = find()
    except KafkaSetupMissing as exc:
        if requested == "kafka":
            raise KafkaSetupMissing(f"--engine kafka: {exc}") from None
        return BrokerChoice("tansu", f"embedded broker: tansu, not Apache Kafka, because {exc}; {TANSU_USE}")
    why = "--engine kafka" if requested == "kafka" else "Java and its jars are installed"
    return BrokerChoice("kafka", f"embedded broker: Apache Kafka, one KRaft node ({why}: {install.java}, "
                                 f"{install.libs}); it takes a few seconds to start")
