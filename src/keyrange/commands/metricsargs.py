"""Where a command serves its metrics, shared by `keyrange worker` and `keyrange operator`.

`--metrics-port P` binds the port when the command starts. `--metrics-fd FD` takes a socket its
parent already bound and listens on (passed with `pass_fds`), so the port is the command's from the
moment the parent chose it: a port chosen free and bound only by the starting command could be
taken in between, which is how a test once lost an operator. The two exclude each other.
"""

from __future__ import annotations

import argparse
import socket

from keyrange.errors import UserError


def add_metrics_arguments(parser: argparse.ArgumentParser, port_help: str, port_default: int | None = None) -> None:
    """The `--metrics-port` and `--metrics-fd` options; `port_help` says what the port serves."""
    metrics = parser.add_mutually_exclusive_group()
    metrics.add_argument("--metrics-port", type=int, default=port_default, help=port_help)
    metrics.add_argument("--metrics-fd", type=int,
                         help="serve the same on this inherited listening socket instead of a port (the parent "
                              "binds it, so no other process can take the port while this one starts; `keyrange "
                              "run` does so for each worker)")


def metrics_listener(args: argparse.Namespace) -> socket.socket | None:
    """The listening socket the options give, or None for neither (or port 0); UserError for an fd
    that is not a socket or a port that cannot be bound."""
    if args.metrics_fd is not None:
        try:
            return socket.socket(fileno=args.metrics_fd)
        except OSError as exc:
            raise UserError(f"--metrics-fd {args.metrics_fd} is not an open socket: {exc.strerror}") from None
    if not args.metrics_port:
        return None
    try:
        return socket.create_server(("", args.metrics_port))
    except OSError as exc:
        raise UserError(f"cannot serve metrics on port {args.metrics_port}: {exc.strerror}") from None
