"""Supervisor.stop: every step runs even when an earlier one fails, so `keyrange run` never leaves
its embedded broker (or its controller) behind after a worker that would not stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ledger.yaml"


class Step:
    def __init__(self, done: list[str], name: str, fails: bool = False) -> None:
        self.done, self.name, self.fails = done, name, fails

    def __call__(self) -> None:
        self.done.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name} failed")


class Part:
    """A fleet, controller or broker whose stop (or close) is recorded, and maybe fails."""

    def __init__(self, done: list[str], name: str, fails: bool = False) -> None:
        self.stop = self.close = Step(done, name, fails)


def test_a_failing_fleet_stop_still_closes_the_controller_and_stops_the_broker(tmp_path: Path) -> None:
    supervisor = Supervisor(load_file(EXAMPLE), EXAMPLE, None, tmp_path / "run")
    done: list[str] = []
    supervisor.fleet = Part(done, "fleet", fails=True)  # type: ignore[assignment]
    supervisor.controller = Part(done, "controller", fails=True)  # type: ignore[assignment]
    supervisor.broker = Part(done, "broker")  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="controller failed"):  # the last failure
        supervisor.stop()
    assert done == ["fleet", "controller", "broker"]
