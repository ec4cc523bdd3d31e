"""The local fleet's restart backoff (Kubernetes' CrashLoopBackOff), on a fake clock and fake
processes: a worker that died once restarts at once, one that keeps dying waits 1, 2, 4, ... s up
to the cap, and one that stayed up long enough starts a new count."""

from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from keyrange.local.fleet import ProcessFleet
from keyrange.local.restarts import RestartBackoff


def test_the_first_exit_restarts_at_once_then_the_wait_doubles_up_to_the_cap() -> None:
    backoff = RestartBackoff(first_delay_seconds=1, max_delay_seconds=30)
    assert [backoff.delay_seconds(n) for n in range(1, 9)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay_seconds(10_000) == 30


def test_a_worker_that_stayed_up_long_enough_starts_a_new_count() -> None:
    backoff = RestartBackoff(reset_after_seconds=60)
    assert backoff.exits_in_a_row(0, up_seconds=0.5) == 1
    assert backoff.exits_in_a_row(5, up_seconds=59.9) == 6
    assert backoff.exits_in_a_row(5, up_seconds=60) == 1


@pytest.mark.parametrize("kwargs", [{"first_delay_seconds": 0}, {"first_delay_seconds": 60, "max_delay_seconds": 30},
                                    {"reset_after_seconds": 0}])
def test_bounds_are_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartBackoff(**kwargs)


class FakeProcess:
    """A started worker process that runs until the test sets its return code."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.returncode = -signal.SIGTERM

    def kill(self) -> None:
        self.returncode = -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[FakeProcess]:
    """Every process the fleet starts, in order (no process is really started)."""
    processes: list[FakeProcess] = []

    def popen(*args: Any, **kwargs: Any) -> FakeProcess:
        processes.append(FakeProcess(pid=len(processes) + 1))
        return processes[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    return processes


def fleet(tmp_path: Path, clock: Clock) -> ProcessFleet:
    return ProcessFleet(tmp_path / "spec.yaml", "127.0.0.1:9092", tmp_path / "logs", clock=clock,
                        backoff=RestartBackoff(first_delay_seconds=1, max_delay_seconds=4, reset_after_seconds=60))


def test_a_worker_that_keeps_exiting_is_restarted_ever_later(tmp_path: Path, started: list[FakeProcess],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    f = fleet(tmp_path, clock)
    f.scale_to(1)
    assert len(started) == 1
    waits = []
    for _ in range(6):
        started[-1].returncode = 2
        began = clock.now
        # Ticks every 0.1 s: the restart comes at the first tick past the backoff, not before.
        while f.check() == []:
            clock.now += 0.1
        waits.append(round(clock.now - began, 1))
    assert waits == [0, 1, 2, 4, 4, 4]
    assert f.workers[0].restarts == 6
    worker_log = tmp_path / "logs" / "worker-0.log"
    assert f"worker 0 exited with code 2; restarting it now; its log: {worker_log}" in caplog.text
    assert f"worker 0 exited with code 2 (4 exits in a row); restarting it in 4 s; its log: {worker_log}" in caplog.text
    # Said once per exit, not at every tick of the wait.
    assert caplog.text.count("exits in a row") == 5


def test_a_worker_that_stayed_up_long_enough_is_restarted_at_once_again(tmp_path: Path,
                                                                     started: list[FakeProcess]) -> None:
    clock = Clock()
    f = fleet(tmp_path, clock)
    f.scale_to(1)
    for _ in range(3):  # three quick exits: the next restart would wait 4 s
        started[-1].returncode = 2
        f.check()
        clock.now += 5
        f.check()
    assert f.workers[0].exits_in_a_row == 3 and f.workers[0].restarts == 3
    clock.now += 60
    started[-1].kill()
    assert f.check() == [0]
    assert f.workers[0].exits_in_a_row == 1


def test_scale_to_does_not_restart_a_dead_worker_before_its_backoff(tmp_path: Path, started: list[FakeProcess],
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    f = fleet(tmp_path, clock)
    f.scale_to(1)
    started[-1].kill()
    f.check()
    started[-1].kill()
    caplog.set_level(logging.WARNING)
    f.scale_to(2)  # starts ordinal 1; ordinal 0 waits its 1 s
    assert len(started) == 3 and f.workers[1].alive() and not f.workers[0].alive()
    assert "worker 0 was killed by SIGKILL (2 exits in a row); restarting it in 1 s" in caplog.text
    clock.now += 1
    assert f.check() == [0]
