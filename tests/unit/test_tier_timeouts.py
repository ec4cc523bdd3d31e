"""Each tier's conftest.py gives its tests their own timeout (tests/timeouts.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import RUNS_LAST, SESSION_TEARDOWN_SECONDS
from tests.unit.conftest import TIMEOUT_SECONDS

ROOT = Path(__file__).resolve().parents[2]


def teardown_allowance(request: pytest.FixtureRequest) -> float:
    """What the last test of this pytest process gets on top of its timeout (when run alone, that is this one)."""
    return SESSION_TEARDOWN_SECONDS if request.node.stash.get(RUNS_LAST, False) else 0


def test_a_unit_test_gets_the_unit_tiers_timeout(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args == (TIMEOUT_SECONDS + teardown_allowance(request),)


@pytest.mark.timeout(7)
def test_a_test_keeps_its_own_timeout(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args == (7 + teardown_allowance(request),)


SLOW_TO_STOP_CONFTEST = """
import time
import pytest

{hook}

@pytest.fixture(scope="session")
def slow_to_stop():
    yield
    time.sleep(2)  # stands in for stopping a broker at the session's end
"""

TWO_QUICK_TESTS = """
import pytest

@pytest.mark.timeout(1)
def test_first(slow_to_stop):
    pass

@pytest.mark.timeout(1)
def test_last(slow_to_stop):
    pass
"""


ALLOWANCE = "from tests.timeouts import last_test_allowance\npytest_runtest_protocol = last_test_allowance(10)"


@pytest.mark.parametrize(("hook", "workers", "outcome"), [
    ("", [], "2 passed, 1 error"),
    (ALLOWANCE, [], "2 passed in"),
    ("", ["-n", "2"], "2 passed, 2 errors"),
    (ALLOWANCE, ["-n", "2"], "2 passed in"),  # each xdist worker runs one test: its last
], ids=["without-the-allowance", "with-it", "without-it-on-two-xdist-workers", "with-it-on-two-xdist-workers"])
def test_the_session_s_last_test_gets_time_to_finalize_the_session_s_fixtures(
        tmp_path: Path, hook: str, workers: list[str], outcome: str) -> None:
    (tmp_path / "conftest.py").write_text(SLOW_TO_STOP_CONFTEST.format(hook=hook))
    (tmp_path / "test_session.py").write_text(TWO_QUICK_TESTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *workers, str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert outcome in run.stdout, run.stdout + run.stderr
