"""wait_until_stopped: a paused Kafka node is frozen before `pause` returns (SIGSTOP is asynchronous)."""

from __future__ import annotations

import signal
import subprocess
import sys

from keyrange.local.kafka_cluster import wait_until_stopped

BUSY_THREADS = """
import threading
def spin():
    while True:
        pass
for _ in range(4):
    threading.Thread(target=spin).start()
"""


def test_every_thread_of_a_stopped_process_is_seen_stopped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY_THREADS])
    try:
        assert not wait_until_stopped(proc.pid, timeout_seconds=0.2)  # running: never reported stopped
        proc.send_signal(signal.SIGSTOP)
        assert wait_until_stopped(proc.pid, timeout_seconds=10)
        proc.send_signal(signal.SIGCONT)
        assert not wait_until_stopped(proc.pid, timeout_seconds=0.2)
    finally:
        proc.kill()
        proc.wait()
