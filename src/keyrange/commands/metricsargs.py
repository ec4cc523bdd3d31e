"""Where a command serves its metrics, shared by `keyrange worker` and `keyrange operator`, and
the two ways any of its listeners is had: inherited by fd or bound to a port.

`--metrics-port P` binds the port when the command starts. `--metrics-fd FD` takes a socket its
parent already bound and listens on (passed with `pass_fds`), so the port is the command's from the
moment the parent chose it: a port chosen free and bound only by the starting command could be
taken in between, which is how a test once lost an operator. The two exclude each other. The
operator's health endpoint and alert webhook take the same pair (`--liveness-fd`, `--webhook-fd`).
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
        return inherited_socket("--metrics-fd", args.metrics_fd)
    if not args.metrics_port:
        return None
    return bound_socket("metrics", args.metrics_port)


def inherited_socket(option: str, fd: int) -> socket.socket:
    """The socket a parent passed as `fd` with `option` (e.g. `--metrics-fd`); UserError if `fd` is
    not an open socket."""
    try:
        return socket.socket(fileno=fd)
    except OSError as exc:
        raise UserError(f"{option} {fd} is not an open socket: {exc.strerror}") from None


def bound_socket(what: str, port: int, host: str = "") -> socket.socket:
    """A socket listening on `port` of `host` (all IPv4 interfaces by default); UserError, saying it
    cannot serve `what`, if the port cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise UserError(f"cannot serve {what} on port {port}: {exc.strerror}") from None
    except OverflowError:
        raise UserError(f"cannot serve {what} on port {port}: a TCP port is 0-65535") from None
