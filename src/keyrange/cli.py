"""The `keyrange` command.

Each subcommand lives in `keyrange.commands.<name>` with `add_arguments(parser)` and
`run(args) -> int`, imported only when used so that `keyrange worker` never loads Spark or kopf.
A `UserError` prints as one line and exits 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from keyrange import __version__
from keyrange.errors import UserError

COMMANDS: dict[str, str] = {
    "run": "run a StreamConsumer YAML on this machine, rescaling on lag",
    "demo": "the local demo: embedded broker, the kata's load with a burst, a report",
    "worker": "one worker process: consume partitions, handle events in order, commit",
    "operator": "the Kubernetes operator (kopf) that reconciles StreamConsumers",
    "broker": "run a Kafka broker on 127.0.0.1: embedded tansu, or Apache Kafka with --engine kafka",
    "produce": "produce the kata's event stream (load generator)",
    "aggregate": "the PySpark job that aggregates processed records into Parquet",
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; subcommand arguments load lazily in `main`."""
    parser = argparse.ArgumentParser(prog="keyrange", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"keyrange {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def command_parser(name: str) -> tuple[argparse.ArgumentParser, ModuleType]:
    """The parser of subcommand `name` (one of COMMANDS) and the module that runs it."""
    module = importlib.import_module(f"keyrange.commands.{name}")
    parser = argparse.ArgumentParser(prog=f"keyrange {name}", description=COMMANDS[name])
    module.add_arguments(parser)
    return parser, module


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `keyrange` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = build_parser()
    if not argv or argv[0] not in COMMANDS:
        top.parse_args(argv)  # prints usage / version / the unknown-command error
        return 2
    name = argv[0]
    parser, module = command_parser(name)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"keyrange {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
