"""benchmarks/handoff_steps.py reads the steps from the workers' own log lines (copied from a run)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.handoff_steps import spread, steps

RELEASE = ("2026-11-29 11:55:59,292 INFO keyrange.worker.engine: released slots [6, 7, 8, 9, 10, 11] in 221 ms "
           "(in-flight calls 4 ms, the transaction in flight and commit 217 ms; 3 joined the transaction in flight)")
ACQUIRE = ("2026-11-29 11:56:08,926 INFO keyrange.worker.engine: acquired slots [6, 7, 8, 9, 10, 11] at offsets "
           "{'6': 1077, '7': 427} in 99 ms (producers initialised 44 ms, then the read-ahead ended 0 ms, restore 40 ms "
           "after a read-ahead; restored 0 finished-after-commit offsets, 5813 uuids, 0 client states)")
COLD_ACQUIRE = ("2026-11-29 11:55:54,161 INFO keyrange.worker.engine: acquired slots [0, 1] at offsets {'0': 0} in "
                "279 ms (producers initialised 96 ms, then the read-ahead ended 0 ms, restore 149 ms; restored 0 "
                "finished-after-commit offsets)")


def test_each_step_is_read_from_the_worker_logs_and_cold_acquires_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker-0.log").write_text(f"{COLD_ACQUIRE}\n{RELEASE}\nsomething else\n")
    (tmp_path / "logs" / "worker-1.log").write_text(f"{ACQUIRE}\n")
    assert steps(tmp_path) == {
        "release": [221], "release: transaction in flight and commit": [217],
        "acquire after a read-ahead": [99], "acquire: init_transactions": [44],
        "acquire: restore after the read-ahead": [40],
    }


def test_spread_gives_p50_p90_and_max() -> None:
    assert spread(range(1, 11)) == "6 / 10 / 10 (n 10)"
    assert spread([]) == "none"
