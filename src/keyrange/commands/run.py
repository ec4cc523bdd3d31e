"""`keyrange run -f streamconsumer.yaml`: run a StreamConsumer on this machine, rescaling on lag."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from keyrange.commands.engineargs import add_engine_argument, announce_broker
from keyrange.commands.outputfolder import make_output_folder
from keyrange.errors import UserError
from keyrange.loadgen import LoadShape
from keyrange.local.fleet import check_handler
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.supervisor import Supervisor, default_run_dir
from keyrange.spec import load_file

DEFAULT_CLIENTS = 100
"""Distinct clients of the load --produce writes."""
TABLE_EVERY_SECONDS_WHEN_PIPED = 10.0
"""Without a terminal, the table is printed this often instead of redrawn every second."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange run`."""
    parser.add_argument("-f", "--file", required=True, type=Path, help="the StreamConsumer YAML")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: spec.kafka.bootstrapServers, "
                                            "else an embedded broker: see --engine)")
    add_engine_argument(parser)
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--produce", type=float, metavar="RATE",
                        help="also produce the kata's load at RATE events/s into the input topic")
    parser.add_argument("--ledger", action="store_true", help="with --produce: ledger commands")
    parser.add_argument("--clients", type=int, help=f"with --produce: distinct clients (default {DEFAULT_CLIENTS})")
    parser.add_argument("--run-dir", type=Path, help="where worker logs go (default .keyrange/<name>)")
    parser.add_argument("--quiet", action="store_true", help="no live table")
    parser.add_argument("--webhook-port", type=int, metavar="PORT",
                        help="scale from Prometheus alerts: serve the Alertmanager webhook on 127.0.0.1:PORT and "
                             "write Prometheus/Alertmanager configs to <run-dir>/prometheus (docs/autoscaling.md); "
                             "default: the planner reads lag directly")
    parser.add_argument("--webhook-token", help="bearer token for --webhook-port (default $KEYRANGE_WEBHOOK_TOKEN)")


def run(args: argparse.Namespace) -> int:
    """Validate the spec, start everything, show the table until Ctrl-C or --duration, stop cleanly."""
    consumer = load_file(args.file)
    check_handler(consumer.spec.handler, consumer.spec.handler_config)
    if args.produce is not None and args.produce <= 0:
        raise UserError(f"--produce must be a positive rate, got {args.produce}")
    if args.duration is not None and args.duration <= 0:
        raise UserError(f"--duration must be positive, got {args.duration}")
    shaping = [flag for flag, given in (("--ledger", args.ledger), ("--clients", args.clients is not None)) if given]
    if shaping and args.produce is None:
        flags = " and ".join(shaping)
        raise UserError(f"{flags} {'shapes' if len(shaping) == 1 else 'shape'} the load that --produce writes: "
                        f"add --produce RATE, or drop {flags}")
    if args.clients is not None and args.clients < 1:
        raise UserError(f"--clients must be at least 1, got {args.clients}")
    mapping = consumer.spec.input.mapping()
    try:
        mapping.parser  # noqa: B018 - a user decoder that cannot load stops here, not in every worker
    except UserError as exc:
        raise UserError(f"{args.file}: spec.{exc}") from None
    if args.produce and not mapping.is_default:
        raise UserError("--produce writes keyrange's own input format (JSON with clientId, uuid and created), "
                        f"which {args.file}'s spec.input does not read: produce your topic's records yourself, "
                        "or drop spec.input to use --produce")
    bootstrap = args.bootstrap or consumer.spec.kafka.bootstrap_servers
    if bootstrap and args.engine is not None:
        raise UserError(f"--engine picks the embedded broker, and this run uses the Kafka at {bootstrap} "
                        f"({'--bootstrap' if args.bootstrap else 'spec.kafka.bootstrapServers'}): drop one of them")
    alerting = None
    if args.webhook_port is not None:
        from keyrange.autoscale.receiver import load_token
        from keyrange.local.monitoring import AlertingOptions

        if not 0 <= args.webhook_port <= 65535:
            raise UserError(f"--webhook-port must be a TCP port (0-65535), got {args.webhook_port}")
        alerting = AlertingOptions(args.webhook_port, load_token(args.webhook_token))
    run_dir = make_output_folder(args.run_dir or default_run_dir(consumer.name), "--run-dir")
    embedded = None if bootstrap else announce_broker(args.engine, "keyrange run")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    supervisor = Supervisor(consumer, args.file.resolve(), args.bootstrap, run_dir, alerting=alerting,
                            broker=embedded)
    load_thread: threading.Thread | None = None
    load = LoadTotals()
    try:
        supervisor.start()
        print(f"keyrange run {consumer.name}: broker {supervisor.bootstrap}, topic {consumer.spec.kafka.topic}, "
              f"worker logs in {supervisor.run_dir / 'logs'} (Ctrl-C to stop)", flush=True)
        if supervisor.alerts is not None:
            print(f"scaling from alerts: webhook {supervisor.alerts.webhook_url}, Prometheus and Alertmanager "
                  f"configs in {supervisor.alerts.dir}", flush=True)
        if args.produce:
            assert supervisor.bootstrap is not None
            shape = LoadShape(rate=args.produce, clients=args.clients or DEFAULT_CLIENTS, ledger=args.ledger)
            phases = [Phase(args.duration or 10**9, args.produce)]
            load_thread = threading.Thread(
                target=produce_phases, args=(supervisor.bootstrap, consumer.spec.kafka.topic, shape, phases, stop,
                                             load, supervisor.client_properties), daemon=True)
            load_thread.start()
        _loop(supervisor, stop, args, load if args.produce else None)
    finally:
        stop.set()
        print("stopping: workers finish in-flight events and commit ...", file=sys.stderr, flush=True)
        if load_thread is not None:
            load_thread.join(timeout=30)
        supervisor.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if supervisor.history:
        last = supervisor.history[-1]
        print(f"handled {last.processed:,} events, dropped {last.duplicates:,} duplicates, "
              f"{len(supervisor.controller.rescales) if supervisor.controller else 0} rescales")
    return 0


def _loop(supervisor: Supervisor, stop: threading.Event, args: Any, load: LoadTotals | None) -> None:
    tty = sys.stdout.isatty() and not args.quiet
    deadline = None if args.duration is None else time.monotonic() + args.duration
    last_print = 0.0
    while not stop.wait(supervisor.tick_seconds):
        supervisor.tick()
        now = time.monotonic()
        if not args.quiet and (tty or now - last_print >= TABLE_EVERY_SECONDS_WHEN_PIPED):
            last_print = now
            table = supervisor.table()
            if load is not None:
                table += f"\n  produced {load.sent:,} events ({load.duplicates:,} duplicates)"
            print(("\x1b[H\x1b[2J" if tty else "") + table, flush=True)
        if deadline is not None and now >= deadline:
            return
