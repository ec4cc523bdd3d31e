"""Helpers for tests that run `keyrange worker` as a subprocess: its command line, starting it with
its output in a log file, reading its /metrics, and waiting on a condition while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PARTITIONS = 6
"""Partitions of the input topic; the worker owns them all."""
REPO = Path(__file__).resolve().parents[2]
"""The repository root: the worker runs from there, with it on PYTHONPATH."""


def worker_command(bootstrap: str, topic: str, port: int, *extra: str) -> list[str]:
    """`keyrange worker` on every partition of `topic` with the ledger handler, serving metrics on `port`."""
    return [sys.executable, "-m", "keyrange.cli", "worker", "--bootstrap", bootstrap, "--topic", topic,
            "--group", f"{topic}-g", "--partitions", f"0-{PARTITIONS - 1}", "--handler", "ledger",
            "--handler-config", '{"delayMs": 3}', "--concurrency", "16", "--commit-interval-ms", "50",
            "--worker-id", "w1", "--ttl-seconds", "300", "--metrics-port", str(port), "--summary-seconds", "1",
            "--log-level", "INFO",
            *extra]


def repo_env() -> dict[str, str]:
    """This process's environment with the checkout's source and then the repository (for tests.*
    handlers) first on PYTHONPATH, the rest kept: the subprocess imports this checkout's keyrange,
    not the one the venv installed (a worktree's tests would run another tree's source)."""
    paths = [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def start(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `command` from the repository, its output appended to `log_path`."""
    env = repo_env()
    with log_path.open("ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def metric_sum(port: int, name: str) -> float:
    """Sum of a metric's samples on the worker's /metrics, or -1 when not served yet."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def condensed(log_text: str) -> str:
    """The log with each run of identical lines (a stalled worker's summary, once a second) shown
    once and counted: a failure's whole story fits the few kilobytes CI keeps of it."""
    out: list[str] = []
    runs = 0
    for line in log_text.splitlines():
        if out and line == out[-1]:
            runs += 1
            continue
        if runs:
            out.append(f"  [the line above {runs} more times]")
            runs = 0
        out.append(line)
    if runs:
        out.append(f"  [the line above {runs} more times]")
    return "\n".join(out)


def wait(condition: object, what: str, timeout_seconds: float = 120.0, proc: subprocess.Popen[bytes] | None = None,
         log_path: Path | None = None) -> None:
    """Poll `condition` until true; fail with `what` (and the log, condensed) after the deadline or
    if `proc` exits."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():  # type: ignore[operator]
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited ({proc.returncode}) while waiting for {what}:\n{_log(log_path)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{_log(log_path)}")
        time.sleep(0.1)


def _log(log_path: Path | None) -> str:
    return condensed(log_path.read_text()) if log_path else ""
