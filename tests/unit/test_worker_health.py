"""The worker's probes: liveness follows the event loop's heartbeat, stuck handler threads and
releases held up by them."""

from __future__ import annotations

import socket

import pytest

from keyrange.worker.health import Health, serve


def test_liveness_follows_the_heartbeat_and_stuck_threads() -> None:
    now = [100.0]
    stuck = [0]
    health = Health(stale_after_seconds=30, max_abandoned=2, abandoned=lambda: stuck[0], clock=lambda: now[0])
    assert health.liveness() == (True, "starting") and health.readiness() == (False, "starting")
    health.beat()
    health.mark_started()
    assert health.liveness() == (True, "ok") and health.readiness() == (True, "ok")
    now[0] += 31
    alive, why = health.liveness()
    assert not alive and "has not run for 31 s" in why and not health.readiness()[0]
    health.beat()
    stuck[0] = 2
    alive, why = health.liveness()
    assert not alive and "2 handler calls timed out" in why
    stuck[0] = 1
    alive, why = health.liveness()
    assert alive and why.startswith("ok (1 handler call(s) timed out and still run")
    stuck[0] = 0
    assert health.liveness() == (True, "ok")


def test_liveness_fails_while_a_release_waits_for_a_timed_out_call() -> None:
    held: list[str | None] = [None]
    health = Health(max_abandoned=4, abandoned=lambda: 1, held_releases=lambda: held[0])
    health.beat()
    assert health.liveness()[0]
    held[0] = "the release of slot 3 waits for 1 handler call(s)"
    assert health.liveness() == (False, held[0])
    held[0] = None
    assert health.liveness()[0]


def test_a_scraper_that_hangs_up_is_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """A scraper that gave up after its timeout (a busy machine) closes the connection before the
    answer is written: the worker's log shows no traceback for it; other errors are still shown."""
    listener = socket.create_server(("127.0.0.1", 0))
    server = serve(listener, Health())
    try:
        for hung_up in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise hung_up
            except OSError:
                server.handle_error(None, ("127.0.0.1", 1))  # type: ignore[arg-type]
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a real bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))  # type: ignore[arg-type]
        assert "a real bug" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
