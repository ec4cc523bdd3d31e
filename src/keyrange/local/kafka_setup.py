"""What an Apache Kafka node needs before it starts: Java, the broker's jars and its settings.

The jars come from Maven Central (`scripts/install-kafka.sh`, run by `make kafka` and `make tools`,
puts them in the checkout's `.tools/kafka/libs`) or from an Apache Kafka download named by `$KAFKA_HOME`. The
settings are those of a test or laptop cluster on 127.0.0.1: internal topics replicated to every
node, no auto-created topics, no rebalance delay, and short timers wherever a test would wait.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from keyrange.errors import UserError
from keyrange.toolsdir import tools_dir


class KafkaSetupMissing(UserError, RuntimeError):
    """Java or the Apache Kafka jars are not installed."""


def _has_broker_jars(libs: Path) -> bool:
    return any(libs.glob("kafka_2.13-*.jar"))


def kafka_libs() -> Path:
    """The folder of the broker's jars: `$KAFKA_HOME/libs` when set, else the tools folder's."""
    candidates: list[Path] = []
    home = os.environ.get("KAFKA_HOME")
    if home:
        candidates.append(Path(home) / "libs")
    candidates.append(tools_dir() / "kafka" / "libs")
    for libs in candidates:
        if _has_broker_jars(libs):
            return libs
    where = " nor in ".join(str(c) for c in reversed(candidates))
    if not home:
        where += " ($KAFKA_HOME is not set)"
    raise KafkaSetupMissing(
        f"Apache Kafka's jars are not in {where}: run `make kafka` (or `make tools`) in the keyrange checkout "
        "(scripts/install-kafka.sh fetches them from Maven Central), or set KAFKA_HOME to an Apache Kafka 4.x download"
    )


MIN_JAVA_MAJOR = 17
"""Apache Kafka 4's brokers need Java 17 or newer."""
JAVA_FIX = "install one (`make kafka` in the keyrange checkout does, or apt-get install openjdk-17-jre-headless)"


def java_binary() -> str:
    """`$JAVA_HOME/bin/java`, else `java` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaSetupMissing(f"Apache Kafka needs Java {MIN_JAVA_MAJOR} or newer, and no `java` is on the PATH: "
                                f"{JAVA_FIX} or set JAVA_HOME")
    return found


def java_major_version(java: str) -> int | None:
    """The major version `java -version` reports; None when it does not run."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_java_version(done.stderr + done.stdout)


def parse_java_version(text: str) -> int | None:
    """The major version in `java -version`'s answer: 8 for "1.8.0_392", 17 for "17.0.15"; None
    when it names none."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


@dataclass(frozen=True)
class KafkaInstall:
    """What a single Apache Kafka node needs on this machine: a recent enough Java and the jars."""

    java: str
    libs: Path


def find_kafka(java: Callable[[], str] = java_binary, libs: Callable[[], Path] = kafka_libs,
               version: Callable[[str], int | None] = java_major_version) -> KafkaInstall:
    """Java (17+) and the broker's jars, or KafkaSetupMissing naming what is missing and the fix.
    The lookups are parameters so that the choice of broker can be tested on any machine."""
    jars = libs()  # first: it costs nothing, `java -version` starts a JVM
    binary = java()
    major = version(binary)
    if major is None or major < MIN_JAVA_MAJOR:
        found = f"`{binary} -version` names no version" if major is None else f"{binary} is Java {major}"
        raise KafkaSetupMissing(f"Apache Kafka needs Java {MIN_JAVA_MAJOR} or newer, and {found}: {JAVA_FIX} "
                                "and put it first on the PATH or set JAVA_HOME")
    return KafkaInstall(binary, jars)


def class_archive(java: str, libs: Path) -> Path | None:
    """Where the JVM's class-data archive for this Java and these jars lives (it may not exist yet).

    A node started with the archive skips most class loading and verification: on 2 busy cores
    that is seconds per node. The name holds a digest of the Java binary and the jar list, since
    an archive only fits the JVM and class path it was made with. None without a tools folder
    (jars from `$KAFKA_HOME` only): there is nowhere to keep it.
    """
    home = tools_dir() / "kafka"
    if not home.is_dir():
        return None
    real_java = Path(java).resolve()
    key = f"{real_java}:{real_java.stat().st_mtime_ns}:{libs}:{sorted(p.name for p in libs.glob('*.jar'))}"
    return home / f"classes-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


@dataclass(frozen=True)
class NodeAddress:
    """Where one node listens: its client port, its KRaft controller port, extra listeners' ports."""

    node_id: int
    port: int
    controller_port: int
    extra_ports: Mapping[str, int]
    """Port of each extra listener, by listener name."""


def min_insync_replicas(nodes: int) -> int:
    """2 with three or more nodes (one may be lost with acks=all), else 1."""
    return max(1, min(2, nodes - 1))


def local_cluster_settings(nodes: int) -> dict[str, str]:
    """Broker settings for a cluster of `nodes` on one machine, for tests and `keyrange broker`."""
    isr = str(min_insync_replicas(nodes))
    return {
        # Topics keyrange creates without a replication factor get every node, as in production.
        "default.replication.factor": str(nodes),
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": str(nodes),
        "transaction.state.log.replication.factor": str(nodes),
        "transaction.state.log.min.isr": isr,
        # Fewer coordinator partitions than the default 50: the first group join and the first
        # init_transactions create these topics, and 50 partitions take seconds on 2 cores.
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.num.partitions": "8",
        "group.initial.rebalance.delay.ms": "0",
        # keyrange creates its topics explicitly; a typo must fail, not create a topic.
        "auto.create.topics.enable": "false",
        # Tests use short session timeouts (the default floor is 6 s).
        "group.min.session.timeout.ms": "1000",
        # A zombie's open transaction is aborted about 1 s after its transaction.timeout.ms
        # (default check every 10 s), so tests with short transaction timeouts see it promptly.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        # A frozen replica leaves the ISR after 10 s instead of 30 s, and in a cluster a killed or
        # frozen node is fenced (its partitions get new leaders) after 4 s instead of 9 s. A single
        # node has nobody to hand its partitions to: fencing it only fails every request ("All
        # brokers are currently fenced"), which a starved JVM on a busy machine caused within 4 s.
        "replica.lag.time.max.ms": "10000",
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "4000" if nodes > 1 else "30000",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
    }


def server_properties(node: NodeAddress, cluster: list[NodeAddress], log_dir: Path,
                      extra_listeners: Mapping[str, str] | None = None,
                      overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """One combined broker+controller node's server.properties.

    `extra_listeners` maps a listener name to its security protocol (e.g. SECURE -> SASL_SSL);
    its port is `node.extra_ports[name]`. Clients use PLAINTEXT (always present) or those.
    """
    extra = dict(extra_listeners or {})
    listeners = [f"PLAINTEXT://127.0.0.1:{node.port}", f"CONTROLLER://127.0.0.1:{node.controller_port}"]
    listeners += [f"{name}://127.0.0.1:{node.extra_ports[name]}" for name in extra]
    advertised = [listeners[0], *listeners[2:]]
    protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT", **extra}
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(advertised),
        "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.quorum.voters": ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in cluster),
        "log.dirs": str(log_dir),
        **local_cluster_settings(len(cluster)),
    }
    props.update(overrides or {})
    return props


def write_properties(path: Path, props: Mapping[str, str]) -> None:
    """Write a Java .properties file (values escaped as Java reads them)."""
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n")

    path.write_text("".join(f"{k}={escape(v)}\n" for k, v in props.items()), encoding="utf-8")


LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka.server.KafkaRaftServer
logger.kafka.level = INFO
"""
"""The broker's log config: warnings and errors, plus the one line that says the node started."""
