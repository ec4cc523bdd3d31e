"""Broker start-up: how long until each broker the tests use serves, and how long it takes to stop.

Start -> ready is `start()` returning: tansu answering Metadata; Apache Kafka formatting its
storage, every node answering ApiVersions on its client port and the metadata listing every node.
tansu is the baseline. Kafka is measured with the JVM class-data archive that the first run leaves
in .tools/kafka, with the default JIT and with the tests' `QUICK_START_JVM_OPTIONS`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.harness import row
from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.local.kafka_cluster import QUICK_START_JVM_OPTIONS, KafkaCluster


def _time(make: Any) -> tuple[float, float]:
    broker = make()
    started = time.monotonic()
    broker.start()
    ready = time.monotonic() - started
    started = time.monotonic()
    broker.stop()
    return ready, time.monotonic() - started


def run(quick: bool) -> list[dict[str, Any]]:
    """Median start -> ready and stop times of tansu, Kafka with one node and with three."""
    repeats = 1 if quick else 5
    _time(lambda: KafkaCluster(nodes=1))  # writes the class-data archive if this machine has none
    quick = QUICK_START_JVM_OPTIONS
    kinds = {"tansu": EmbeddedBroker, "kafka 1 node": lambda: KafkaCluster(nodes=1),
             "kafka 1 node, tests' JVM options": lambda: KafkaCluster(nodes=1, jvm_options=quick),
             "kafka 3 nodes": lambda: KafkaCluster(nodes=3),
             "kafka 3 nodes, tests' JVM options": lambda: KafkaCluster(nodes=3, jvm_options=quick)}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for name, make in kinds.items():
            runs[name].append(_time(make))

    def median(name: str, index: int) -> float:
        return round(statistics.median(r[index] for r in runs[name]), 2)

    rows = []
    for name in kinds:
        all_ready = [round(r[0], 2) for r in runs[name]]
        rows.append(row(f"broker start -> ready: {name}", median(name, 0), "s", None, median("tansu", 0),
                        f"baseline: tansu; median of {repeats}; runs {all_ready}"))
        rows.append(row(f"broker stop (SIGTERM, clean): {name}", median(name, 1), "s", None, median("tansu", 1),
                        f"median of {repeats}"))
    return rows


if __name__ == "__main__":
    from benchmarks.harness import format_table, quick_from_command_line

    print(format_table(run(quick_from_command_line("benchmarks.bench_broker_start", __doc__))))
