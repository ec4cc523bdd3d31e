"""Apache Kafka (KRaft) on 127.0.0.1 (`KafkaCluster` of `KafkaNode`s): one node or a quorum of
several, for tests, benchmarks and `keyrange broker --engine kafka`.

Every node is a combined broker+controller JVM with its own ports and log folder inside one
temporary folder, removed on stop. Nodes can be killed, frozen, resumed and restarted one at a
time, for fault tests (tests/kafka_cluster_helpers.py reads leaders and in-sync replicas).
Readiness is the broker's own answer: every node answers ApiVersions on its client port (a KRaft
broker opens that port only once it is unfenced) and the cluster's metadata lists every node.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from keyrange.local.embedded_broker import BrokerError
from keyrange.local.kafka_setup import (
    LOG4J2_PROPERTIES,
    NodeAddress,
    class_archive,
    java_binary,
    kafka_libs,
    server_properties,
    write_properties,
)
from keyrange.local.ports import free_port

QUICK_START_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)
"""For tests: only the JVM's quick compiler. A node needs about a third less CPU to start
(BENCHMARKS.md) and a test's short run never reaches the optimising compiler's pay-off; benchmarks
leave it out."""

STOP_GRACE_SECONDS = 20.0
"""How long a node may take to shut down on SIGTERM before it is killed."""


STOP_WAIT_SECONDS = 10.0


def wait_until_stopped(pid: int, timeout_seconds: float = STOP_WAIT_SECONDS) -> bool:
    """Whether every thread of process `pid` is stopped (state T, as after SIGSTOP) within
    `timeout_seconds`. Linux only (reads /proc)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            states = [(task / "stat").read_text().rpartition(")")[2].split()[0]
                      for task in Path(f"/proc/{pid}/task").iterdir()]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            states = []  # a thread ended while being read: look again
        if states and all(state in "tT" for state in states):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def answers_api_versions(port: int, timeout_seconds: float = 1.0) -> bool:
    """True when a Kafka broker on 127.0.0.1:`port` answers an ApiVersions (v0) request without error."""
    client_id = b"keyrange-probe"
    request = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_seconds) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            header = _read_exactly(sock, 10)
    except OSError:
        return False
    if header is None:
        return False
    _size, correlation_id, error_code = struct.unpack(">iih", header)
    return bool(correlation_id == 1 and error_code == 0)


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def new_cluster_id() -> str:
    """A random KRaft cluster id (a UUID in URL-safe base64), never starting with "-": the storage
    tool's argument parser would take one such as "-Xk3..." for an option (1 start in 64 failed:
    "argument --cluster-id/-t: expected one argument"). Kafka's own Uuid.randomUuid() rejects them too."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass
class KafkaNode:
    """One broker+controller JVM of a `KafkaCluster`; signals for fault tests."""

    address: NodeAddress
    directory: Path
    java_command: Sequence[str]
    """`java` and its options up to the main class."""
    class_archive: Path | None = None
    """The JVM's class-data archive (`kafka_setup.class_archive`): used when it exists."""
    writes_class_archive: bool = False
    """When the archive does not exist yet, this node writes it as it exits."""
    paused: bool = field(default=False, init=False)
    """True between `pause` and `resume`."""
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def node_id(self) -> int:
        """The node's `node.id` (1, 2, 3, ...)."""
        return self.address.node_id

    @property
    def bootstrap(self) -> str:
        """This node's PLAINTEXT client address."""
        return f"127.0.0.1:{self.address.port}"

    @property
    def log_file(self) -> Path:
        """The node's log (warnings and errors)."""
        return self.directory / "server.log"

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def launch(self) -> None:
        """Start the JVM without waiting for it (see `KafkaCluster.wait_until_ready`)."""
        if self.is_running():
            raise BrokerError(f"Kafka node {self.node_id} is already running")
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [*self.jvm_command(), "kafka.Kafka", str(self.directory / "server.properties")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
            )

    def jvm_command(self) -> list[str]:
        """`java_command` with the class-data archive option that fits now."""
        java, *options = self.java_command
        if self.class_archive is not None:
            if self.class_archive.exists():
                return [java, f"-XX:SharedArchiveFile={self.class_archive}", *options]
            if self.writes_class_archive:
                return [java, f"-XX:ArchiveClassesAtExit={self.directory / 'classes.jsa'}", *options]
        return [java, *options]

    @property
    def archives_on_exit(self) -> bool:
        """Whether this node, as it exits, writes the class-data archive that does not exist yet."""
        return self.writes_class_archive and self.class_archive is not None and not self.class_archive.exists()

    def is_running(self) -> bool:
        """True while the JVM is alive (frozen counts as alive)."""
        return self._process is not None and self._process.poll() is None

    def is_serving(self) -> bool:
        """True when the node answers ApiVersions on its client port."""
        return self.is_running() and answers_api_versions(self.address.port)

    def kill(self) -> None:
        """SIGKILL: the node dies at once, as in a crash."""
        self._signal_and_reap(signal.SIGKILL, 10.0)

    def terminate(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL after `grace_seconds`."""
        self._signal_and_reap(signal.SIGTERM, grace_seconds)

    def ask_to_shut_down(self) -> None:
        """Send SIGTERM without waiting, so that several nodes shut down together."""
        if self._process is not None and self.is_running():
            self._process.send_signal(signal.SIGTERM)
            self._process.send_signal(signal.SIGCONT)

    def pause(self) -> None:
        """SIGSTOP: the node freezes (no heartbeats, no fetches) but keeps its sockets open.
        Returns once every thread of the JVM is stopped: the signal takes effect asynchronously,
        and a request arriving meanwhile could still be answered."""
        if self._process is not None and self.is_running():
            self._process.send_signal(signal.SIGSTOP)
            self.paused = True
            if not wait_until_stopped(self._process.pid):
                raise BrokerError(f"Kafka node {self.address.node_id} did not stop on SIGSTOP within "
                                  f"{STOP_WAIT_SECONDS:g} s")

    def resume(self) -> None:
        """SIGCONT: a paused node carries on."""
        if self._process is not None and self.is_running():
            self._process.send_signal(signal.SIGCONT)
        self.paused = False

    def _signal_and_reap(self, sig: signal.Signals, grace_seconds: float) -> None:
        proc = self._process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            if sig != signal.SIGKILL:
                proc.send_signal(signal.SIGCONT)  # a paused JVM cannot act on SIGTERM
            try:
                proc.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._process = None
        self.paused = False
        self._keep_class_archive()

    def _keep_class_archive(self) -> None:
        written = self.directory / "classes.jsa"
        if self.class_archive is None or not written.exists():
            return
        # Another process may be writing the same archive: each copies to its own name first.
        partial = self.class_archive.with_name(f"{self.class_archive.name}.{os.getpid()}.partial")
        with contextlib.suppress(OSError):
            if written.stat().st_size > 0 and not self.class_archive.exists():
                self.class_archive.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(written, partial)
                os.replace(partial, self.class_archive)
            written.unlink()


@dataclass
class KafkaCluster:
    """Apache Kafka in KRaft mode on 127.0.0.1 with `nodes` combined nodes; a context manager.

    Topics default to a replication factor of `nodes` and `min.insync.replicas` 2 from three
    nodes on (`kafka_setup.local_cluster_settings`). `broker_config` overrides any setting;
    `extra_listeners` adds listeners (name -> security protocol) beside PLAINTEXT, and
    `format_args` go to `kafka-storage format` (e.g. `--add-scram`).
    """

    nodes: int = 1
    port: int = 0
    """Client port of node 1; 0 picks a free one (the other nodes always get free ports)."""
    heap: str = "512m"
    """Maximum Java heap of each node."""
    jvm_options: Sequence[str] = ()
    """More JVM options for every node, e.g. `QUICK_START_JVM_OPTIONS`."""
    start_timeout_seconds: float = 90.0
    broker_config: Mapping[str, str] = field(default_factory=dict)
    extra_listeners: Mapping[str, str] = field(default_factory=dict)
    format_args: Sequence[str] = ()
    members: list[KafkaNode] = field(default_factory=list, init=False)
    """The nodes, node.id 1 first."""
    _root: Path | None = field(default=None, init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        """Every node's PLAINTEXT address, comma-separated."""
        return ",".join(n.bootstrap for n in self.members)

    def start(self) -> str:
        """Format and start every node, wait until the cluster serves, return the bootstrap address."""
        if self.nodes < 1:
            raise BrokerError(f"a Kafka cluster needs at least one node, not {self.nodes}")
        libs, java = kafka_libs(), java_binary()
        self._root = Path(tempfile.mkdtemp(prefix="keyrange-kafka-"))
        try:
            self._prepare(java, libs)
            for node in self.members:
                node.launch()
            self.wait_until_ready(self.start_timeout_seconds)
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    def _prepare(self, java: str, libs: Path) -> None:
        assert self._root is not None
        addresses = [
            NodeAddress(i, self.port if i == 1 and self.port else free_port(), free_port(),
                        {name: free_port() for name in self.extra_listeners})
            for i in range(1, self.nodes + 1)
        ]
        cluster_id = new_cluster_id()
        archive = class_archive(java, libs)
        formats = []
        for address in addresses:
            directory = self._root / f"node-{address.node_id}"
            directory.mkdir()
            (directory / "log4j2.properties").write_text(LOG4J2_PROPERTIES, encoding="utf-8")
            write_properties(directory / "server.properties", server_properties(
                address, addresses, directory / "data", self.extra_listeners, self.broker_config))
            command = [java, f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                       "-Djava.awt.headless=true", *self.jvm_options,
                       f"-Dlog4j2.configurationFile={directory / 'log4j2.properties'}",
                       "-cp", f"{libs}/*"]
            # The first run with these jars writes the archive as node 1 exits; later runs use it.
            node = KafkaNode(address, directory, command, archive, writes_class_archive=address.node_id == 1)
            self.members.append(node)
            formatter = node.jvm_command() if archive is not None and archive.exists() else command
            formats.append(subprocess.Popen(
                [*formatter, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                 "-c", str(directory / "server.properties"), *self.format_args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        for node, proc in zip(self.members, formats, strict=True):
            output, _ = proc.communicate()
            if proc.returncode != 0:
                raise BrokerError(f"formatting Kafka node {node.node_id}'s storage failed: "
                                  f"{output.decode('utf-8', 'replace').strip()[-2000:]}")

    def wait_until_ready(self, timeout_seconds: float, nodes: Sequence[KafkaNode] | None = None) -> None:
        """Block until `nodes` (default all) answer ApiVersions and the metadata lists them."""
        wanted = list(self.members if nodes is None else nodes)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            dead = [n for n in wanted if not n.is_running()]
            if dead:
                raise BrokerError(self._failure(dead[0], "exited while starting"))
            if all(n.is_serving() for n in wanted) and self._registered() >= {n.node_id for n in wanted}:
                return
            time.sleep(0.1)
        slow = next((n for n in wanted if not n.is_serving()), wanted[0])
        raise BrokerError(self._failure(slow, f"did not serve within {timeout_seconds:g} s"))

    def _registered(self) -> set[int]:
        serving = ",".join(n.bootstrap for n in self.members if n.is_running())
        admin = AdminClient({"bootstrap.servers": serving, "log_level": 0})
        try:
            return set(admin.list_topics(timeout=2.0).brokers)
        except Exception:  # noqa: BLE001 - not answering yet
            return set()

    def _failure(self, node: KafkaNode, what: str) -> str:
        text = ""
        with contextlib.suppress(OSError):
            text = node.log_file.read_text(encoding="utf-8", errors="replace")
        tail = "\n".join(text.strip().splitlines()[-15:]) or "no output"
        return f"Kafka node {node.node_id} (port {node.address.port}) {what}; its log ends with:\n{tail}"

    def node(self, node_id: int) -> KafkaNode:
        """The node with this node.id."""
        return next(n for n in self.members if n.node_id == node_id)

    def restart(self, node: KafkaNode, timeout_seconds: float | None = None) -> None:
        """Stop `node` (SIGTERM if it still runs), start it again with its data, wait until it serves."""
        node.terminate()
        node.launch()
        self.wait_until_ready(timeout_seconds or self.start_timeout_seconds, [node])

    def is_running(self) -> bool:
        """True while every node's JVM is alive."""
        return bool(self.members) and all(n.is_running() for n in self.members)

    def stop(self) -> None:
        """SIGKILL every node and remove the folder: the data goes with it, so a controlled shutdown
        (seconds of closing logs) would save nothing. A node writing the class-data archive gets
        SIGTERM (and SIGKILL after the grace period): the JVM writes the archive as it exits."""
        archiving = [node.archives_on_exit for node in self.members]
        for node, archives in zip(self.members, archiving, strict=True):
            if archives:
                node.ask_to_shut_down()
        for node, archives in zip(self.members, archiving, strict=True):
            if archives:
                node.terminate()
            else:
                node.kill()
        self.members = []
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
