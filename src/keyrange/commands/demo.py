"""`keyrange demo`: embedded broker, the kata's load with a burst, live rescaling, a report and a plot."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from keyrange.local.demo import run_demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange demo`."""
    parser.add_argument("--out", type=Path, default=Path("keyrange-demo"),
                        help="where the report, the plot and the worker logs go (default ./keyrange-demo)")
    parser.add_argument("--quick", action="store_true", help="shorter phases (~80 s instead of ~150 s)")


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 1 if a guarantee check failed (an event lost or handled twice)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    report = run_demo(args.out, args.quick, sys.stdout)
    return 1 if report.lost or report.handled_twice else 0
