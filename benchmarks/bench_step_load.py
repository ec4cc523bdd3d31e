"""A step load, sized by the target planner and by the one-step planner, side by side in one run.

`keyrange run`'s supervisor (the planner reading the workers' metrics, no Alertmanager) under a
quiet -> burst -> quiet load of a `sleep` 10 ms consumer on 12 partitions: 400 -> 3,000 -> 300
ev/s with 8 permits per worker (about 800 ev/s each, so the burst needs 4 workers) and
`workers.max: 6`; `--quick`: 100 -> 450 -> 60 ev/s with 2 permits (about 200 ev/s each, 3
workers), `workers.max: 4`. Both policies run with `cooldownSeconds: 10`. Per policy: time from the
burst's start to the needed size, scale decisions, overshoot (workers above the need), flaps (a
split after a merge) and the worst trailing-5 s latency p99 during the burst and after it.

    python -m benchmarks --only step_load [--quick] [--broker kafka|tansu|both]
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import load_average, row, running_broker, ticking
from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase, produce_phases
from keyrange.local.scaling_report import flaps
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file

FULL = {"phases": (20, 400, 40, 3000, 40, 300), "concurrency": 8, "max": 6}
QUICK = {"phases": (10, 100, 30, 450, 35, 60), "concurrency": 2, "max": 4}
HANDLER_SECONDS = 0.010


def _spec(path: Path, topic: str, policy: str, concurrency: int, max_workers: int) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer", "metadata": {"name": "step-load"},
        "spec": {
            "kafka": {"topic": topic, "partitions": 12},
            "handler": "sleep", "handlerConfig": {"meanMs": HANDLER_SECONDS * 1000, "stddevMs": 1},
            "concurrency": concurrency, "workers": {"min": 1, "max": max_workers},
            "scaling": {"cooldownSeconds": 10, "policy": policy},
        },
    }))
    return path


def measure(policy: str, setup: dict[str, Any], workdir: Path, engine: str) -> dict[str, Any]:
    """One run of the step load under `policy`."""
    quiet_s, quiet, burst_s, burst, after_s, after = setup["phases"]
    needed = math.ceil(burst / (setup["concurrency"] / HANDLER_SECONDS))
    with running_broker(engine) as bootstrap:
        topic = f"step-{policy}-{time.time_ns()}"
        spec_file = _spec(workdir / "consumer.yaml", topic, policy, setup["concurrency"], setup["max"])
        sup = Supervisor(load_file(spec_file), spec_file, bootstrap, workdir / "run")
        with ticking(sup) as stop:
            phases = [Phase(quiet_s, quiet), Phase(burst_s, burst), Phase(after_s, after)]
            started = time.time()
            produce_phases(bootstrap, topic, LoadShape(rate=quiet, duplicate_ratio=0.0, seed=3), phases, stop)
    assert sup.controller is not None
    burst_ms, after_ms = (started + quiet_s) * 1000, (started + quiet_s + burst_s) * 1000
    reached = [p.at_ms for p in sup.history if p.at_ms >= burst_ms and p.workers >= needed]
    sizes = [1] + [r.workers_after for r in sup.controller.rescales]

    def worst_p99(first_ms: float, last_ms: float) -> float | None:
        values = [p.p99_latency_seconds for p in sup.history
                  if first_ms <= p.at_ms < last_ms and p.p99_latency_seconds is not None]
        return max(values, default=None)

    return {"needed": needed, "time_to_size_s": (reached[0] - burst_ms) / 1000 if reached else None,
            "decisions": len(sup.controller.rescales), "overshoot": max(sizes) - needed, "flaps": flaps(sizes),
            "p99_burst_s": worst_p99(burst_ms, after_ms), "p99_after_s": worst_p99(after_ms + 10_000, math.inf),
            "sizes": sizes}


def run(quick: bool, brokers: tuple[str, ...] = ("kafka",)) -> list[dict[str, Any]]:
    """Rows for BENCHMARKS.md: the target planner's figures, the step planner's as their baseline."""
    setup = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    for engine in brokers:
        results = {}
        for policy in ("target", "step"):
            loads = load_average()
            with tempfile.TemporaryDirectory(prefix="keyrange-bench-") as tmp:
                results[policy] = {**measure(policy, setup, Path(tmp), engine), "load": loads}
        target, step = results["target"], results["step"]
        notes = f"phases {setup['phases']}; target sizes {target['sizes']} ({target['load']}), " \
                f"step sizes {step['sizes']} ({step['load']})"
        for key, name, unit in (("time_to_size_s", "burst start -> the needed size", "s"),
                                ("decisions", "scale decisions", "decisions"),
                                ("overshoot", "workers above the need", "workers"),
                                ("flaps", "flaps (a split after a merge)", "flaps"),
                                ("p99_burst_s", "worst 5 s latency p99 during the burst", "s"),
                                ("p99_after_s", "worst 5 s latency p99 after it (from 10 s on)", "s")):
            value = target[key]
            rows.append(row(f"step load, target planner: {name}", -1 if value is None else round(value, 2),
                            unit, None, None if step[key] is None else round(step[key], 2),
                            f"baseline: the step planner; {notes}" if key == "time_to_size_s" else "",
                            broker=engine))
    return rows


if __name__ == "__main__":
    from benchmarks.harness import quick_from_command_line

    for r in run(quick=quick_from_command_line("benchmarks.bench_step_load", __doc__)):
        print(r)
