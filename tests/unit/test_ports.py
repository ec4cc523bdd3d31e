"""free_port: a random free port below the kernel's ephemeral range, which outgoing connections
draw their local ports from (so none of them can take it before the caller binds it)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from keyrange.local.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    choose_port,
    ephemeral_range,
    free_port,
    is_free,
    server_can_bind,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("32768\t60999\n", (32768, 60999)),
    ("1024 65535\n", (1024, 65535)),
    ("garbage\n", DEFAULT_EPHEMERAL_RANGE),
    ("60999 32768\n", DEFAULT_EPHEMERAL_RANGE),
    (None, DEFAULT_EPHEMERAL_RANGE),
])
def test_the_ephemeral_range_is_read_from_the_kernel_or_assumed(tmp_path: Path, text: str | None,
                                                                expected: tuple[int, int]) -> None:
    path = tmp_path / "ip_local_port_range"
    if text is not None:
        path.write_text(text)
    assert ephemeral_range(path) == expected


def test_ports_are_chosen_at_random_below_the_ephemeral_range() -> None:
    rng = random.Random(7)
    ports = [choose_port((32768, 60999), rng, lambda port: True) for _ in range(2000)]
    assert all(p is not None and 10000 <= p < 32768 for p in ports)
    assert len(set(ports)) > 1900  # spread, so that two processes seldom pick the same one


def test_a_port_in_use_is_passed_over() -> None:
    tried: list[int] = []

    def is_free(port: int) -> bool:
        tried.append(port)
        return len(tried) == 3

    port = choose_port((32768, 60999), random.Random(1), is_free)
    assert port == tried[-1] and len(set(tried)) == 3


def test_without_a_free_port_below_the_range_there_is_no_choice() -> None:
    assert choose_port((32768, 60999), random.Random(1), lambda port: False) is None
    assert choose_port((1024, 65535), random.Random(1), lambda port: True) is None
    assert choose_port((2000, 65535), random.Random(1), lambda port: True) in range(1024, 2000)


def test_free_port_is_below_this_machine_s_ephemeral_range_and_bindable() -> None:
    first, _ = ephemeral_range()
    port = free_port()
    assert port < first
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_listening_port_is_not_free() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        assert not is_free(listener.getsockname()[1])


def test_a_server_cannot_bind_a_listened_port_but_can_one_its_predecessor_left_in_time_wait() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert not server_can_bind(port)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
    accepted.close()  # the server's side closes first: its port stays in TIME_WAIT
    client.close()
    assert not is_free(port)
    assert server_can_bind(port)
