"""`keyrange broker`: the embedded Kafka-protocol broker, in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from keyrange.local.broker import EmbeddedBroker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange broker`."""
    parser.add_argument("--port", type=int, default=9092, help="TCP port on 127.0.0.1 (default 9092; 0 = any free)")
    parser.add_argument(
        "--storage",
        default="memory://tansu/",
        help="tansu storage URL (default memory://tansu/: data is lost on stop)",
    )


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its bootstrap address, wait for Ctrl-C or SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    broker = EmbeddedBroker(port=args.port, storage_url=args.storage)
    broker.start()
    print(broker.bootstrap, flush=True)
    print(f"embedded broker ready at {broker.bootstrap} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.5):
            if not broker.is_running():
                print("keyrange broker: the broker process exited unexpectedly", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    return 0
