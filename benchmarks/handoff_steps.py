"""`python -m benchmarks.handoff_steps [--broker kafka|tansu] [--rescales N]`: where a handoff's
pause goes, step by step.

Runs `bench_handoff.measure_handoffs` (back-to-back forced rescales under 1,000 events/s, after 12
warm-up rescales on a new broker) with the workers' INFO logs, and reports the moved slots' pauses
beside the two steps each worker times itself: the old owner's release (of it, waiting for the
transaction in flight and committing) and the new owner's acquire (of it, `init_transactions` and
the restore of what was appended after the read-ahead). What is left of a pause is the control
topic's hops: the release's report, the controller's grant, the new owner reading it.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from benchmarks.bench_handoff import measure_handoffs
from benchmarks.harness import load_average, running_broker

RELEASED = re.compile(r"released slots .* in (\d+) ms \(in-flight calls \d+ ms, the transaction in flight and "
                      r"commit (\d+) ms")
ACQUIRED = re.compile(r"acquired slots .* in (\d+) ms \(producers initialised (\d+) ms, then the read-ahead ended "
                      r"\d+ ms, restore (\d+) ms after a read-ahead")


def spread(values: Iterable[float]) -> str:
    """`p50 / p90 / max (n)` of `values`."""
    v = sorted(values)
    if not v:
        return "none"
    return f"{v[len(v) // 2]:g} / {v[min(int(len(v) * 0.9), len(v) - 1)]:g} / {v[-1]:g} (n {len(v)})"


def steps(logs: Path) -> dict[str, list[float]]:
    """Per step, its durations in ms, from every worker log under `logs`."""
    found: dict[str, list[float]] = {k: [] for k in ("release", "release: transaction in flight and commit",
                                                     "acquire after a read-ahead", "acquire: init_transactions",
                                                     "acquire: restore after the read-ahead")}
    for path in sorted(logs.rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if m := RELEASED.search(line):
                found["release"].append(int(m[1]))
                found["release: transaction in flight and commit"].append(int(m[2]))
            elif m := ACQUIRED.search(line):
                found["acquire after a read-ahead"].append(int(m[1]))
                found["acquire: init_transactions"].append(int(m[2]))
                found["acquire: restore after the read-ahead"].append(int(m[3]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.handoff_steps", description=__doc__)
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--rescales", type=int, default=12, help="measured rescales (after 12 warm-up ones)")
    args = parser.parse_args()
    print(f"{load_average()} before", flush=True)
    with tempfile.TemporaryDirectory() as tmp, running_broker(args.broker) as bootstrap:
        run = measure_handoffs(Path(tmp), args.rescales, bootstrap, warmup=12, worker_args=("--log-level", "INFO"))
        print(f"{load_average()} after")
        print(f"{args.broker}: moved-slot pause, ms p50 / p90 / max: {spread(round(p * 1000) for p in run.pauses)}")
        for step, durations in steps(Path(tmp)).items():
            print(f"  {step}, ms (warm-up rescales included): {spread(durations)}")


if __name__ == "__main__":
    main()
