"""`keyrange demo`: embedded broker (`--engine`), the kata's load with a burst, live rescaling, a report and a plot."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from keyrange.commands.engineargs import add_engine_argument, announce_broker
from keyrange.commands.outputfolder import make_output_folder
from keyrange.errors import UserError
from keyrange.local.demo import run_demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange demo`."""
    parser.add_argument("--out", type=Path, default=Path("keyrange-demo"),
                        help="where the report, the plot and the worker logs go (default ./keyrange-demo)")
    parser.add_argument("--quick", action="store_true", help="shorter phases (~80 s instead of ~150 s)")
    parser.add_argument("--no-aggregate", dest="aggregate", action="store_false",
                        help="skip the Spark aggregation in the report (for machines without Java)")
    add_engine_argument(parser)
    # Tests only: every load phase this many seconds.
    parser.add_argument("--phase-seconds", type=float, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 1 if a check failed: an event lost or handled twice, or the Spark
    aggregation failed or counted other than the distinct processed uuids."""
    if args.phase_seconds is not None and args.phase_seconds <= 0:
        raise UserError(f"--phase-seconds must be positive, got {args.phase_seconds}")
    make_output_folder(args.out, "--out")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    broker = announce_broker(args.engine, "keyrange demo", sys.stdout)
    report = run_demo(args.out, args.quick, sys.stdout, args.aggregate, args.phase_seconds, broker)
    return 1 if report.lost or report.handled_twice or report.aggregation_mismatch else 0
