"""`keyrange run`'s worker processes (ProcessFleet) and their metrics ports, on the session broker.

Another process may take a port at any time (the suite's Kafka clients draw their local ports
from the same ephemeral range as the free ports the fleet gives its workers), and a worker that
cannot bind its port exits. So the fleet binds each worker's port itself and passes the socket
down, and gives a restarted worker a new port. A worker that keeps exiting at start is restarted
ever later (1, 2, 4, ... s), not at every tick.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keyrange.autoscale.scrape import scrape
from keyrange.local.fleet import ProcessFleet
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: fleet}}
spec:
  kafka: {{topic: {topic}, groupId: {topic}-g, partitions: 2}}
  handler: sleep
  workers: {{min: 1, max: 1}}
"""


FAILING_SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {name: failing}
spec:
  kafka: {topic: failing, partitions: 2}
  handler: no_such_module_here:handle
  workers: {min: 1, max: 1}
"""


@pytest.fixture
def supervisor(bootstrap: str, topic_name: str, tmp_path: Path) -> Iterator[Supervisor]:
    """A started supervisor of one worker; it is not ticked unless the test ticks it."""
    path = tmp_path / "consumer.yaml"
    path.write_text(SPEC.format(topic=topic_name))
    sup = Supervisor(load_file(path), path, bootstrap, tmp_path / "run")
    sup.start()
    try:
        yield sup
    finally:
        sup.stop()


def worker_logs(sup: Supervisor) -> str:
    return "".join(f"{p.name}: {p.read_text()}" for p in sorted((sup.run_dir / "logs").glob("*.log")))


def serving(fleet: ProcessFleet, ordinal: int) -> bool:
    url = fleet.urls().get(ordinal)
    return url is not None and scrape(url, time.monotonic()) is not None


def wait_until(condition: Callable[[], bool], what: str, sup: Supervisor, tick: bool = False,
               timeout_seconds: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}; worker logs:\n"
                                 f"{worker_logs(sup)}")
        if tick:
            sup.tick()
        time.sleep(0.1)


def listen_on(port: int) -> socket.socket:
    """Another process's server on `port` (it fails if the port is taken)."""
    taker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taker.bind(("", port))
        taker.listen()
    except OSError:
        taker.close()
        raise
    return taker


def test_a_restarted_worker_gets_a_new_metrics_port_when_its_old_one_was_taken(supervisor: Supervisor) -> None:
    fleet = supervisor.fleet
    assert fleet is not None
    wait_until(lambda: serving(fleet, 0), "worker 0 to serve /metrics", supervisor)
    old_port = fleet.workers[0].metrics_port
    fleet.kill(0, signal.SIGKILL)
    wait_until(lambda: not fleet.workers[0].alive(), "worker 0 to die", supervisor)
    with listen_on(old_port):
        # The supervisor's ticks restart the worker and scrape whatever port it now has.
        wait_until(lambda: fleet.workers[0].restarts >= 1 and serving(fleet, 0),
                   "the restarted worker 0 to serve /metrics", supervisor, tick=True)
        assert fleet.workers[0].metrics_port != old_port
        assert fleet.workers[0].restarts == 1, worker_logs(supervisor)
        assert fleet.workers[0].alive()


def test_no_other_process_can_take_a_worker_s_port_before_the_worker_serves_on_it(supervisor: Supervisor) -> None:
    fleet = supervisor.fleet
    assert fleet is not None
    # `start` has just returned: worker 0's process is still starting Python (hundreds of ms, more
    # on a loaded machine), the window in which another process could take its port.
    port = fleet.workers[0].metrics_port
    with contextlib.ExitStack() as taken:
        with contextlib.suppress(OSError):
            taken.enter_context(listen_on(port))
        # Not ticked: a worker that failed to bind would not be restarted, as in a test that only
        # starts and stops a supervisor.
        wait_until(lambda: serving(fleet, 0), "worker 0 to serve /metrics", supervisor)
    assert fleet.workers[0].restarts == 0
    assert fleet.workers[0].metrics_port == port


def test_a_worker_that_keeps_exiting_at_start_is_restarted_ever_later(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    spec_file = tmp_path / "failing.yaml"
    spec_file.write_text(FAILING_SPEC)
    now = [0.0]
    # The backoff runs on a fake clock, so the test waits only for each process to exit.
    fleet = ProcessFleet(spec_file, "127.0.0.1:9", tmp_path / "logs", clock=lambda: now[0])
    log_path = tmp_path / "logs" / "worker-0.log"
    caplog.set_level(logging.WARNING, logger="keyrange.local.fleet")
    fleet.scale_to(1)
    try:
        waits = []
        for _ in range(4):
            deadline = time.monotonic() + 60
            while fleet.workers[0].alive():
                assert time.monotonic() < deadline, f"the worker did not exit in 60 s: {log_path.read_text()}"
                time.sleep(0.05)
            began = now[0]
            while not fleet.check():  # a tick every 0.5 s of the fake clock
                now[0] += 0.5
            waits.append(now[0] - began)
        assert waits == [0, 1, 2, 4]
        assert fleet.workers[0].restarts == 4
        assert "cannot import handler module 'no_such_module_here'" in log_path.read_text()
        assert f"worker 0 exited with code 2; restarting it now; its log: {log_path}" in caplog.text
        assert f"worker 0 exited with code 2 (4 exits in a row); restarting it in 4 s; its log: {log_path}" \
            in caplog.text
    finally:
        fleet.stop()
