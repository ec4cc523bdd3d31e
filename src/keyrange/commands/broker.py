"""`keyrange broker`: a Kafka broker on 127.0.0.1, in the foreground.

`--engine tansu` (the default) is the light Kafka-protocol broker; `--engine kafka` is Apache
Kafka in KRaft mode, one node or a quorum (`--nodes 3`), from the jars `make kafka` installs or
from `$KAFKA_HOME/libs`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from keyrange.errors import UserError
from keyrange.local.broker_choice import LocalBroker
from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.local.ports import server_can_bind

DEFAULT_TANSU_STORAGE = "memory://tansu/"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange broker`."""
    parser.add_argument("--engine", choices=("tansu", "kafka"), default="tansu",
                        help="tansu: the light broker (default; starts in 0.1 s, for short runs); kafka: Apache "
                             "Kafka (KRaft), jars from `make kafka` or $KAFKA_HOME/libs")
    parser.add_argument("--port", type=int, default=9092,
                        help="client TCP port on 127.0.0.1 (default 9092; 0 = any free); with --nodes, node 1's")
    parser.add_argument("--nodes", type=int, default=1,
                        help="kafka only: number of nodes in the KRaft quorum (default 1; 3 for a replicated cluster)")
    parser.add_argument("--storage",
                        help=f"tansu only: storage URL (default {DEFAULT_TANSU_STORAGE}: data is lost on stop)")


def _broker(args: argparse.Namespace) -> LocalBroker:
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be a TCP port (0-65535; 0 for any free one), got {args.port}")
    if args.port and not server_can_bind(args.port):
        raise UserError(f"port {args.port} on 127.0.0.1 is in use (another broker?): stop what listens there, "
                        "or pick another with --port (0 for any free one)")
    if args.engine == "tansu":
        if args.nodes != 1:
            raise UserError("tansu runs a single node: --nodes needs --engine kafka")
        return EmbeddedBroker(port=args.port, storage_url=args.storage or DEFAULT_TANSU_STORAGE)
    if args.storage is not None:
        raise UserError("--storage is a tansu setting; Apache Kafka keeps its logs in a temporary folder")
    if args.nodes < 1:
        raise UserError(f"--nodes must be at least 1, got {args.nodes}")
    from keyrange.local.kafka_cluster import KafkaCluster

    return KafkaCluster(nodes=args.nodes, port=args.port)


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its bootstrap address, wait for Ctrl-C or SIGTERM, stop it."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    broker = _broker(args)
    try:
        bootstrap = broker.start()
        if stop.is_set():
            return 0
        print(bootstrap, flush=True)
        print(f"{args.engine} broker ready at {bootstrap} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            if not broker.is_running():
                print("keyrange broker: the broker process exited unexpectedly", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    return 0
