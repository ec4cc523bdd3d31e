"""`keyrange produce`: the kata's event stream, paced, with duplicates."""

from __future__ import annotations

import argparse

from keyrange.commands.kafkaargs import add_kafka_arguments, kafka_properties
from keyrange.errors import UserError
from keyrange.loadgen import LoadShape, run_paced

PRODUCE_RANGES = {"--rate": "events per second above 0", "--clients": "at least 1",
                  "--duplicate-ratio": "a share from 0 to 1", "--count": "at least 1",
                  "--duration": "seconds above 0", "--partitions": "at least 1"}
"""What each numeric option of `keyrange produce` takes, said when a value is outside it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange produce`."""
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--topic", required=True, help="input topic")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second (default 1000)")
    parser.add_argument("--clients", type=int, default=100, help="distinct clients, ids from 1000 (default 100)")
    parser.add_argument("--first-client-id", type=int, default=1000, help="lowest client id (default 1000)")
    parser.add_argument(
        "--duplicate-ratio",
        type=float,
        default=0.01,
        help="share of events sent again 10 ms to 5 s later (default 0.01)",
    )
    limit = parser.add_mutually_exclusive_group(required=True)
    limit.add_argument("--duration", type=float, help="seconds to run")
    limit.add_argument("--count", type=int, help="events to send (not counting duplicates)")
    parser.add_argument("--ledger", action="store_true", help="emit ledger increment/drain commands")
    parser.add_argument("--partitions", type=int, default=12, help="partitions if the topic is created (default 12)")
    parser.add_argument("--seed", type=int, default=None, help="random seed for a reproducible stream")
    add_kafka_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Produce until the count or duration is reached."""
    for flag, value, wrong in (("--rate", args.rate, args.rate <= 0), ("--clients", args.clients, args.clients < 1),
                               ("--duplicate-ratio", args.duplicate_ratio, not 0 <= args.duplicate_ratio <= 1),
                               ("--count", args.count, args.count is not None and args.count < 1),
                               ("--duration", args.duration, args.duration is not None and args.duration <= 0),
                               ("--partitions", args.partitions, args.partitions < 1)):
        if wrong:
            raise UserError(f"{flag} {value:g} is out of range: {PRODUCE_RANGES[flag]}")
    try:
        shape = LoadShape(
            rate=args.rate,
            clients=args.clients,
            first_client_id=args.first_client_id,
            duplicate_ratio=args.duplicate_ratio,
            ledger=args.ledger,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    run_paced(args.bootstrap, args.topic, shape, args.count, args.duration, args.partitions,
              client_properties=kafka_properties(args))
    return 0
