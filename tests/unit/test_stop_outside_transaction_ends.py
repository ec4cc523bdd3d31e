"""The integration tests' way of freezing a worker (tests/integration/supervised.py): a process stopped
by `stop_outside_transaction_ends` never keeps a transaction-end lock, which would hold back every
other producer of its partition on the host by the Kafka timeout before each transaction end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from keyrange.kafkaquirks import transactions_end_one_at_a_time
from tests.integration.supervised import all_threads_stopped, stop_outside_transaction_ends, wait_for

# Ends a "transaction" under the lock most of the time, as a busy slot producer on a loaded host may.
ENDING_ALL_THE_TIME = """
import sys, time
from pathlib import Path
from keyrange.kafkaquirks import transactions_end_one_at_a_time
lock = Path(sys.argv[1])
print("ready", flush=True)
while True:
    with transactions_end_one_at_a_time(lock, 30):
        time.sleep(0.02)
    time.sleep(0.001)
"""


def test_a_process_stopped_outside_transaction_ends_holds_no_end_lock(tmp_path: Path) -> None:
    lock = tmp_path / "end.lock"
    process = subprocess.Popen([sys.executable, "-c", ENDING_ALL_THE_TIME, str(lock)], stdout=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        for _ in range(10):
            stop_outside_transaction_ends(process.pid, [lock], timeout_seconds=10)
            assert all_threads_stopped(process.pid)
            with transactions_end_one_at_a_time(lock, 0) as taken:
                assert taken, "the stopped process kept the transaction-end lock"
            os.kill(process.pid, signal.SIGCONT)
            wait_for(lambda: not all_threads_stopped(process.pid), 10, "the process to resume")
    finally:
        process.kill()
        process.wait(10)
