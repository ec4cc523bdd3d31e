"""Each test tier's own default timeout (pytest-timeout), set by the conftest.py of its directory.

A tier's tests differ by orders of magnitude (unit tests take milliseconds, a rescale test
minutes), so one timeout for all would be too long for one tier or too short for another. A test
or module with its own `@pytest.mark.timeout` keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest


def tier_timeout(directory: Path, seconds: float) -> Callable[[list[pytest.Item]], None]:
    """A `pytest_collection_modifyitems` hook giving the tests under `directory` a timeout of `seconds`."""

    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        for item in items:
            if directory in item.path.parents and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(seconds))

    return pytest_collection_modifyitems


SESSION_TEARDOWN_SECONDS = 120
"""What the last test a pytest process runs gets on top of its own timeout. Its teardown finalizes
the session-scoped fixtures: the 3-node and 1-node Kafka clusters (each node up to 20 s of
controlled shutdown), the control plane (up to 10 s per component) and Spark. Idle, that is about
14 s; on CI it took over 30 s and was charged to a unit test with a 30 s timeout."""

RUNS_LAST = pytest.StashKey[bool]()
"""Set on the test a pytest process runs last (`last_test_allowance`)."""


def last_test_allowance(seconds: float) -> Callable[[pytest.Item, pytest.Item | None], Generator[None, Any, Any]]:
    """A `pytest_runtest_protocol` hook adding `seconds` to the timeout of the last test a pytest
    process runs, the one that finalizes its session fixtures.

    It decides when the test starts, from the test that follows it (none for the last), so it also
    holds for each xdist worker, whose last test is known only then. It wraps pytest-timeout's own
    hook, which reads the timeout when the test starts."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        if nextitem is None:
            item.stash[RUNS_LAST] = True
            marker = item.get_closest_marker("timeout")
            if marker is not None and marker.args and marker.args[0]:  # no timeout (or 0, "none"): nothing to extend
                item.add_marker(pytest.mark.timeout(marker.args[0] + seconds, *marker.args[1:], **marker.kwargs),
                                append=False)
        return (yield)

    return pytest_runtest_protocol
