"""`--engine kafka|tansu` of `keyrange run` and `keyrange demo`: which embedded broker to start
when no bootstrap servers are given (`local.broker_choice`), and the line that says so."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from keyrange.local.broker_choice import ENGINES, Engine, LocalBroker, choose_broker


def add_engine_argument(parser: argparse.ArgumentParser) -> None:
    """The `--engine` option."""
    parser.add_argument("--engine", choices=ENGINES,
                        help="the embedded broker: kafka (Apache Kafka, one KRaft node: Java 17+ and the jars "
                             "`make kafka` fetches) or tansu (no Java; for short runs); default: kafka where Java "
                             "and the jars are installed, else tansu")


def announce_broker(engine: Engine | None, command: str, out: TextIO = sys.stderr) -> LocalBroker:
    """The embedded broker for `--engine engine`, unstarted, after one line on `out` saying which and why."""
    choice = choose_broker(engine)
    print(f"{command}: {choice.notice}", file=out, flush=True)
    return choice.broker()
