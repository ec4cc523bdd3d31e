"""Each test tier's own default timeout (pytest-timeout), set by the conftest.py of its directory.

A tier's tests differ by orders of magnitude (unit tests take milliseconds, a rescale test
minutes), so one timeout for all would be too long for one tier or too short for another. A test
or module with its own `@pytest.mark.timeout` keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def tier_timeout(directory: Path, seconds: float) -> Callable[[list[pytest.Item]], None]:
    """A `pytest_collection_modifyitems` hook giving the tests under `directory` a timeout of `seconds`."""

    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        for item in items:
            if directory in item.path.parents and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(seconds))

    return pytest_collection_modifyitems


SESSION_TEARDOWN_SECONDS = 120
"""What the session's last test gets on top of its own timeout. Its teardown finalizes the
session-scoped fixtures: the 3-node and 1-node Kafka clusters (each node up to 20 s of controlled
shutdown), the control plane (up to 10 s per component) and Spark. Idle, that is about 14 s; on CI
it took over 30 s and was charged to a unit test with a 30 s timeout."""


def session_teardown_allowance(seconds: float) -> Callable[[pytest.Session], None]:
    """A `pytest_collection_finish` hook adding `seconds` to the timeout of the session's last test.

    It runs once the selection is final (after -k, -m and every tier's timeout), so the allowance
    goes to the test that really runs last."""

    def pytest_collection_finish(session: pytest.Session) -> None:
        if not session.items:
            return
        last = session.items[-1]
        marker = last.get_closest_marker("timeout")
        if marker is None or not marker.args or not marker.args[0]:
            return  # no timeout (or 0, pytest-timeout's "none"): nothing to extend
        last.add_marker(pytest.mark.timeout(marker.args[0] + seconds, *marker.args[1:], **marker.kwargs),
                        append=False)

    return pytest_collection_finish
