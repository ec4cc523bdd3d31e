"""`benchmarks.harness.cores_apart`: the broker's threads on one core, the benchmark and what it
starts on another, and everything back where it was afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.harness import cores_apart

THREADS = """
import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""
"""A stand-in for the broker's JVM: a process with several threads (affinity is per thread)."""


def _cpus_of_every_thread(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_the_broker_and_the_benchmark_get_a_core_each_then_all_of_them_back() -> None:
    everything = frozenset(os.sched_getaffinity(0))
    broker_core, worker_core = sorted(everything)[:2]
    broker = subprocess.Popen([sys.executable, "-c", THREADS], stdout=subprocess.PIPE, text=True)
    try:
        assert broker.stdout is not None and broker.stdout.readline().strip() == "ready"
        with cores_apart([broker.pid]) as layout:
            assert _cpus_of_every_thread(broker.pid) == {frozenset({broker_core})}  # its 4 threads
            assert _cpus_of_every_thread(os.getpid()) == {frozenset({worker_core})}
            started = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                                     capture_output=True, text=True, check=True)
            assert started.stdout.strip() == str([worker_core])  # what the benchmark starts inherits it
            assert f"CPU {broker_core}" in layout and f"CPU {worker_core}" in layout
        assert _cpus_of_every_thread(broker.pid) == {everything}
        assert _cpus_of_every_thread(os.getpid()) == {everything}
    finally:
        broker.kill()
        broker.wait()


def test_without_a_broker_process_it_says_what_it_needs() -> None:
    with pytest.raises(RuntimeError, match="needs 2 cores and a broker process"), cores_apart([]):
        pass
