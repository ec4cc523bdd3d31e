"""Worker processes on this machine: the local stand-in for the StatefulSet.

Each worker is `keyrange worker --spec-file F --worker-id N --metrics-fd FD` in controlled mode
(it takes its slots from the control topic). FD is a socket this process bound to a free port and
listens on, so the port is the worker's from the moment it is chosen: choosing a free port and
letting the worker bind it would leave the worker's start as a window in which any process can
take it (on a loaded machine, the Kafka clients draw their local ports from the same range). The
controller calls `scale_to`; the supervisor calls `check` every tick to restart a worker that died
(the handoff protocol lets it catch up from the newest epoch) and to reap the ones it stopped. A
worker that died once is restarted at once; one that keeps dying waits longer before each next
start (`RestartBackoff`, like Kubernetes' CrashLoopBackOff). A handler that cannot be loaded would
make every worker exit at once, again and again: `check_handler` finds it before any worker starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from keyrange.handlers import load_handler
from keyrange.local.restarts import RestartBackoff

log = logging.getLogger(__name__)

STOP_TIMEOUT_SECONDS = 30.0
"""How long a SIGTERMed worker may take to finish in-flight events and commit before SIGKILL."""


def check_handler(name: str, config: Mapping[str, Any]) -> None:
    """Load the handler here as every worker will, so one that cannot be loaded (a module that is
    missing or raises on import, a bad handlerConfig) is one HandlerError now, before any worker
    starts, and not workers that keep exiting. Workers run `python -m keyrange.cli` in this
    directory, which puts it first on their module path: so it is here, for the check."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        load_handler(name, dict(config))
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(here)


def _terminate_with_parent() -> None:
    """In the child: get SIGTERM if the supervisor dies (Linux), so no worker outlives it.

    The signal follows the *thread* that started the child; the supervisor's threads (controller,
    ticks) live until `stop`, which SIGTERMs the workers anyway."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class WorkerProcess:
    """One worker ordinal and its current process."""

    ordinal: int
    metrics_port: int = 0
    """Where the current process serves /metrics: a new port at every start (module docstring)."""
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    exits_in_a_row: int = 0
    """How many times in a row the ordinal's process exited without staying up (`RestartBackoff`)."""
    restart_at: float | None = None
    """When the dead process's successor may start (fleet clock); None until its exit is seen."""
    stopping_since: float | None = None

    @property
    def metrics_url(self) -> str:
        """The worker's /metrics."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None


@dataclass
class ProcessFleet:
    """Runs worker ordinals 0..n-1 as subprocesses (see the module docstring)."""

    spec_file: Path
    bootstrap: str
    log_dir: Path
    extra_args: tuple[str, ...] = ()
    """More `keyrange worker` arguments (tests pass e.g. a commit interval)."""
    max_workers: int = 0
    """With `spare`: never run more processes than this."""
    spare: int = 0
    """Standby processes above the wanted ordinals (they hold nothing), so a split does not wait for
    a Python process to start: the next ordinal already runs and reports."""
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    """How long a worker that keeps exiting waits before its next start."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, for the restart backoff and the stop timeout (tests inject a fake one)."""
    workers: dict[int, WorkerProcess] = field(default_factory=dict)
    desired: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _retired: list[WorkerProcess] = field(default_factory=list)

    def scale_to(self, workers: int) -> None:
        """Run ordinals 0..workers-1 (plus the spares): start the missing ones, SIGTERM those above
        (they commit)."""
        with self._lock:
            workers = max(workers, min(workers + self.spare, self.max_workers)) if self.spare else workers
            self.desired = workers
            now = self.clock()
            for ordinal in range(workers):
                w = self.workers.get(ordinal)
                if w is None or (not w.alive() and w.stopping_since is None and self._restart_due(w, now)):
                    self._start(ordinal)
            for ordinal in [o for o in self.workers if o >= workers]:
                self._retire(self.workers.pop(ordinal))

    def check(self) -> list[int]:
        """Restart workers that died, once their backoff has passed; reap retired ones (SIGKILL past
        the stop timeout). Returns the ordinals restarted."""
        restarted = []
        with self._lock:
            now = self.clock()
            for ordinal in range(self.desired):
                w = self.workers.get(ordinal)
                if w is not None and not w.alive() and self._restart_due(w, now):
                    self._start(ordinal)
                    restarted.append(ordinal)
            for w in list(self._retired):
                if not w.alive():
                    self._retired.remove(w)
                    self._close_log(w)
                elif w.stopping_since is not None and now - w.stopping_since > STOP_TIMEOUT_SECONDS:
                    assert w.process is not None
                    w.process.kill()
        return restarted

    def kill(self, ordinal: int, sig: int = signal.SIGKILL) -> None:
        """Send a signal to one worker (tests and the demo use SIGKILL to show a crash)."""
        with self._lock:
            w = self.workers[ordinal]
            if w.process is not None and w.alive():
                os.kill(w.process.pid, sig)

    def stop(self) -> None:
        """SIGTERM every worker and wait for them to commit and exit."""
        with self._lock:
            self.desired = 0
            for w in list(self.workers.values()):
                self._retire(w)
            self.workers.clear()
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            for w in self._retired:
                if w.process is not None:
                    try:
                        w.process.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        w.process.kill()
                        w.process.wait()
                self._close_log(w)
            self._retired.clear()

    def urls(self) -> dict[int, str]:
        """Ordinal -> /metrics URL of every wanted worker."""
        with self._lock:
            return {o: w.metrics_url for o, w in self.workers.items()}

    def worker_log(self, ordinal: int) -> Path:
        """Where worker `ordinal`'s output goes (appended to across its restarts)."""
        return self.log_dir / f"worker-{ordinal}.log"

    def _start(self, ordinal: int) -> None:
        w = self.workers.get(ordinal)
        if w is None:
            w = WorkerProcess(ordinal)
            self.workers[ordinal] = w
        else:
            w.restarts += 1
            self._close_log(w)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        w.log_file = open(self.worker_log(ordinal), "ab")  # noqa: SIM115 - closed in _close_log
        # A new port at every start: another process may have taken the old one since the worker
        # died. The supervisor scrapes `metrics_url`, so it follows.
        with socket.create_server(("", 0)) as listener:
            w.metrics_port = listener.getsockname()[1]
            command = [sys.executable, "-m", "keyrange.cli", "worker", "--spec-file", str(self.spec_file),
                       "--bootstrap", self.bootstrap, "--worker-id", str(ordinal),
                       "--metrics-fd", str(listener.fileno()), *self.extra_args]
            # Own session: Ctrl-C reaches only the supervisor, which then SIGTERMs workers in order.
            w.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=w.log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         pass_fds=(listener.fileno(),), preexec_fn=_terminate_with_parent)
        w.started_at = self.clock()
        w.restart_at = None
        w.stopping_since = None
        log.info("started worker %d (pid %d, metrics on :%d)", ordinal, w.process.pid, w.metrics_port)

    def _restart_due(self, w: WorkerProcess, now: float) -> bool:
        """For a dead worker: whether its backoff has passed. The first call after its exit counts the
        exit, schedules the restart and says so in the log."""
        if w.restart_at is None:
            # The exit is seen at a tick, so the time up is measured to the tick that saw it.
            w.exits_in_a_row = self.backoff.exits_in_a_row(w.exits_in_a_row, now - w.started_at)
            delay = self.backoff.delay_seconds(w.exits_in_a_row)
            w.restart_at = now + delay
            how = _describe_exit(w.process.returncode if w.process is not None else None)
            log_path = self.worker_log(w.ordinal)
            if delay:
                log.warning("worker %d %s (%d exits in a row); restarting it in %g s; its log: %s",
                            w.ordinal, how, w.exits_in_a_row, delay, log_path)
            else:
                log.warning("worker %d %s; restarting it now; its log: %s", w.ordinal, how, log_path)
        return now >= w.restart_at

    def _retire(self, w: WorkerProcess) -> None:
        if w.alive():
            assert w.process is not None
            w.process.terminate()
        w.stopping_since = self.clock()
        self._retired.append(w)

    @staticmethod
    def _close_log(w: WorkerProcess) -> None:
        if w.log_file is not None:
            w.log_file.close()
            w.log_file = None


def _describe_exit(code: int | None) -> str:
    """"exited with code 2", or "was killed by SIGKILL" for a negative Popen return code."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
