"""Each tier's conftest.py gives its tests their own timeout (tests/timeouts.py)."""

from __future__ import annotations

import pytest

from tests.unit.conftest import TIMEOUT_SECONDS


def test_a_unit_test_gets_the_unit_tiers_timeout(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args == (TIMEOUT_SECONDS,)


@pytest.mark.timeout(7)
def test_a_test_keeps_its_own_timeout(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args == (7,)
