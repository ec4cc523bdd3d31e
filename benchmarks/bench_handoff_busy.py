"""The handoff pause on a busy machine: bench_handoff's handoffs with a CPU hog beside them and without.

The same back-to-back splits and merges as `bench_handoff.measure_handoffs` (1,000 events/s,
`sleep` 2 ms, 12 partitions, 1 <-> 3 workers), once on the machine as it is and once with a busy
loop on every core the benchmark may use (started by the benchmark, stopped after), on Apache
Kafka and on tansu. Per mode: p50/p99/max of the pause as `keyrange_handoff_pause_seconds`
measures it (per moved slot: the new owner's first event after the grant - max(the transit's
publication, its `created`)) and how many handoffs waited out the read-ahead's timeout.

    python -m benchmarks --only handoff_busy [--quick] [--broker kafka|tansu|both]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.bench_handoff import measure_handoffs
from benchmarks.harness import load_average, percentile, row, running_broker

HOG = "while True: pass"


@contextlib.contextmanager
def cpu_hog(cores: int) -> Iterator[None]:
    """Within: `cores` processes spinning at full speed, one per core; killed on exit."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL) for _ in range(cores)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def run(quick: bool, brokers: tuple[str, ...] = ("kafka", "tansu")) -> list[dict[str, Any]]:
    """Per broker and mode (quiet, hog): pause p50/p99/max and read-ahead timeouts."""
    rescales, warmup = (6, 4) if quick else (12, 6)
    cores = len(os.sched_getaffinity(0))
    rows: list[dict[str, Any]] = []
    for engine in brokers:
        for mode in ("no hog", f"CPU hog on {cores} cores"):
            with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-handoff-busy-") as tmp:
                bootstrap = stack.enter_context(running_broker(engine)) if engine == "kafka" else None
                if mode != "no hog":
                    stack.enter_context(cpu_hog(cores))
                before = load_average()
                result = measure_handoffs(Path(tmp), rescales, bootstrap, warmup=warmup, name="busy")
                after = load_average()
            pauses = result.metric_pauses
            timed_out = sum(1 for r in result.rescales if r.not_read_ahead)
            notes = f"{mode}; {len(result.rescales)} rescales, {len(pauses)} slot moves; {before} -> {after}"
            rows += [
                row(f"handoff pause p50 ({mode})", percentile(pauses, 0.5), "s", notes=notes, broker=engine),
                row(f"handoff pause p99 ({mode})", percentile(pauses, 0.99), "s", goal="<= 1 s busy, <= 0.25 s quiet",
                    notes=notes, broker=engine),
                row(f"handoff pause max ({mode})", max(pauses, default=0.0), "s", notes=notes, broker=engine),
                row(f"handoffs that waited out the read-ahead timeout ({mode})", timed_out, "handoffs", goal="0",
                    notes=notes, broker=engine),
            ]
    return rows


if __name__ == "__main__":
    from benchmarks.harness import format_table, quick_from_command_line

    print(format_table(run(quick_from_command_line("benchmarks.bench_handoff_busy", __doc__))))
