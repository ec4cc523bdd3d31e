"""The slot producers' call thread: calls in order, and no wait for a stuck one at exit."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from keyrange.worker.callthread import CallThread


def test_calls_run_in_order_on_one_thread_and_hand_back_results_and_errors() -> None:
    runner = CallThread("test-calls")
    seen: list[tuple[int, str]] = []
    futures = [runner.submit(lambda i=i: seen.append((i, threading.current_thread().name))) for i in range(5)]
    failing = runner.submit(int, "not a number")
    assert [f.result(5) for f in futures] == [None] * 5
    assert seen == [(i, "test-calls") for i in range(5)]
    with pytest.raises(ValueError):
        failing.result(5)
    runner.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        runner.submit(int, "1")


def test_a_call_that_never_returns_does_not_hold_up_the_process_exit() -> None:
    # A ThreadPoolExecutor's thread is joined at exit: this program would never end with one.
    program = ("import threading; from keyrange.worker.callthread import CallThread; "
               "runner = CallThread('stuck'); runner.submit(threading.Event().wait); runner.shutdown(wait=False)")
    assert subprocess.run([sys.executable, "-c", program], timeout=20).returncode == 0
