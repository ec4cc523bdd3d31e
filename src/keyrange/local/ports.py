"""Free TCP ports for servers this machine starts later: the embedded broker, Kafka's nodes, a
worker's `--metrics-port`.

Binding port 0 gives a port from the kernel's ephemeral range, the range every outgoing TCP
connection on the machine takes its local port from. A port chosen that way and bound only later
(by a broker, once started) can be taken in between by any client connecting anywhere: on a loaded
test suite, one of its many Kafka clients. So `free_port` picks at random below that range, where
the kernel never assigns a port by itself, and checks that nothing is bound to it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
"""Linux's default, for systems without the file; below it is below the IANA range (49152-65535)
that macOS and Windows use as well."""
LOWEST_PORT = 10000
"""The lowest port chosen: below it are many well-known services' ports (databases, 8080, 9092)."""
ATTEMPTS = 100
"""Random ports tried before falling back to the kernel's choice."""
_rng = random.Random()
"""Its own generator, seeded from the OS: a test seeding the global one must not make processes
choose the same ports."""


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), or DEFAULT_EPHEMERAL_RANGE if unreadable."""
    try:
        first, last = (int(field) for field in path.read_text(encoding="ascii").split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    if not 0 < first <= last <= 65535:
        return DEFAULT_EPHEMERAL_RANGE
    return first, last


def candidate_ports(ephemeral: tuple[int, int]) -> range:
    """The ports to choose from: below `ephemeral`, down to LOWEST_PORT (to 1024 if the range starts
    that low); empty if it starts at 1024 or lower."""
    first = ephemeral[0]
    return range(LOWEST_PORT if first > LOWEST_PORT else 1024, first)


def choose_port(ephemeral: tuple[int, int], rng: random.Random, is_free: Callable[[int], bool]) -> int | None:
    """A random port below `ephemeral` that `is_free` accepts, or None if ATTEMPTS ports were not
    (or there is no port below it)."""
    candidates = candidate_ports(ephemeral)
    for port in rng.sample(candidates, min(ATTEMPTS, len(candidates))):
        if is_free(port):
            return port
    return None


def is_free(port: int) -> bool:
    """True if nothing is bound to `port` on any IPv4 address (a listener, a connection's local
    end, a socket in TIME_WAIT): the bind has no SO_REUSEADDR, so it is stricter than a server's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            # Every address, not only 127.0.0.1: a server on 0.0.0.0 or another address has it too.
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def server_can_bind(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could listen on `host`:`port` now: with SO_REUSEADDR, as servers bind, so a
    port left in TIME_WAIT by a server that stopped counts as free, and one listened on does not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, below the kernel's ephemeral range (module
    docstring), so that only a process binding it on purpose can take it before the caller does."""
    port = choose_port(ephemeral_range(), _rng, is_free)
    if port is not None:
        return port
    # No free port below the ephemeral range (a range set to start low): the kernel's choice.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
