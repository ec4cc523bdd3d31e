"""`python -m benchmarks [--quick] [--only NAME] [--broker kafka|tansu|both] [--json PATH]`: run
every benchmarks/bench_*.py.

Each module's `run(quick)` returns rows; they are printed as one table and optionally written
as JSON. `--only worker` runs bench_worker.py alone. Modules whose figures depend on the broker
take `run(quick, brokers)` and measure on each chosen broker (Apache Kafka first), each broker's
figures beside their own raw baseline on the same broker.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.harness import BROKERS, format_table, load_average


def discover() -> list[str]:
    """Names of the benchmark modules (bench_<name>.py -> <name>), sorted."""
    here = Path(__file__).resolve().parent
    return sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks and print (and optionally save) their rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, for checking that benchmarks work")
    parser.add_argument("--only", action="append", help="run only this benchmark (repeatable), e.g. worker")
    parser.add_argument("--broker", choices=[*BROKERS, "both"], default="both",
                        help="the broker(s) the broker-dependent benchmarks run on (default both: kafka, then tansu)")
    parser.add_argument("--json", help="also write all rows to this JSON file")
    args = parser.parse_args(argv)
    names = discover()
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown}; available: {names}")
        names = [n for n in names if n in args.only]
    brokers = BROKERS if args.broker == "both" else (args.broker,)
    rows: list[dict[str, Any]] = []
    failed = []
    for name in names:
        started = time.monotonic()
        print(f"== {name} ({'quick' if args.quick else 'full'}) ... {load_average()}", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"benchmarks.bench_{name}")
            takes_brokers = "brokers" in inspect.signature(module.run).parameters
            results = module.run(args.quick, brokers=brokers) if takes_brokers else module.run(args.quick)
            for r in results:
                rows.append({"benchmark": name, **r})
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failed.append(name)
        print(f"== {name} took {time.monotonic() - started:.0f} s; {load_average()}", file=sys.stderr, flush=True)
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if failed:
        print(f"benchmarks that failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
