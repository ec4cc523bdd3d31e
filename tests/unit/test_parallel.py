"""tests/parallel.py: under `-n N --dist loadgroup`, every test that uses a heavy session fixture runs
on one xdist worker, so that only that worker starts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import os
import pytest
from tests.parallel import pytest_collection_modifyitems

@pytest.fixture(scope="session")
def spark():
    return os.environ.get("PYTEST_XDIST_WORKER", "main")

@pytest.fixture
def through_another_fixture(spark):
    return spark
"""

TESTS = """
import os

import pytest

@pytest.mark.parametrize("i", range(6))
def test_with_spark(through_another_fixture, i):
    with open(os.path.join(os.environ["RAN_ON"], f"spark-{i}"), "w") as out:
        out.write(through_another_fixture)

@pytest.mark.parametrize("i", range(6))
def test_without(i):
    pass
"""


def test_the_tests_of_one_heavy_fixture_share_one_xdist_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_groups.py").write_text(TESTS)
    (tmp_path / "ran_on").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "RAN_ON": str(tmp_path / "ran_on")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "3",
                          "--dist", "loadgroup", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "12 passed" in run.stdout, run.stdout + run.stderr
    workers = {(tmp_path / "ran_on" / f"spark-{i}").read_text() for i in range(6)}
    assert len(workers) == 1 and workers != {"main"}, workers


EARLY_STOP_CONFTEST = """
import os
import pytest
from tests.parallel import (pytest_collection_finish, pytest_collection_modifyitems, pytest_runtest_teardown,
                            stopped_after_its_last_test)

def note(what):
    with open(os.environ["EVENTS"], "a") as out:
        out.write(what + "\\n")

@pytest.fixture(scope="session")
def spark(request):
    with stopped_after_its_last_test(request, lambda: note("stopped")):
        yield "spark"
"""

EARLY_STOP_TESTS = {
    "test_a_spark.py": """
import pytest
from conftest import note

@pytest.fixture(scope="module")
def held(spark):
    yield spark
    note("module fixture released")

@pytest.mark.parametrize("i", range(2))
def test_uses(held, i):
    note(f"uses {i}")

def test_plain_in_the_same_module():
    note("plain")
""",
    "test_b_other.py": """
from conftest import note

def test_other():
    note("other")
""",
}


def test_a_heavy_fixture_stops_after_its_last_test_once_its_module_is_torn_down(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(EARLY_STOP_CONFTEST)
    for name, text in EARLY_STOP_TESTS.items():
        (tmp_path / name).write_text(text)
    events = tmp_path / "events"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "EVENTS": str(events)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                          str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "4 passed" in run.stdout, run.stdout + run.stderr
    assert events.read_text().splitlines() == [
        "uses 0", "uses 1", "plain", "module fixture released", "stopped", "other"]


ORDER_CONFTEST = """
from tests.parallel import pytest_collection_modifyitems

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow test")
"""

ORDER_TESTS = {
    "test_a_quick.py": "def test_one():\n    pass\n\ndef test_two():\n    pass\n",
    "test_b_mixed.py": "import pytest\n\ndef test_quick():\n    pass\n\n"
                       "@pytest.mark.slow\ndef test_slow():\n    pass\n",
    "test_c_quick.py": "def test_three():\n    pass\n",
    "test_d_slow.py": "import pytest\n\npytestmark = pytest.mark.slow\n\ndef test_four():\n    pass\n",
}


def test_the_modules_with_a_slow_test_are_collected_first_each_whole_and_in_order(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(ORDER_CONFTEST)
    for name, text in ORDER_TESTS.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                          "--collect-only", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    collected = [line.split("::", 1)[1] for line in run.stdout.splitlines() if "::" in line]
    assert collected == ["test_quick", "test_slow", "test_four", "test_one", "test_two", "test_three"]
