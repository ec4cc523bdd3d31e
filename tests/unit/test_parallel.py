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
