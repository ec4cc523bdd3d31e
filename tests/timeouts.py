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
