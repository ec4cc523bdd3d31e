"""The worker's probes: liveness follows the event loop's heartbeat, stuck handler threads and
releases held up by them."""

from __future__ import annotations

from keyrange.worker.health import Health


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
