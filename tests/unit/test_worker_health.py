"""The worker's probes: liveness follows the event loop's heartbeat and stuck handler threads."""

from __future__ import annotations

from keyrange.worker.health import Health


def test_liveness_follows_the_heartbeat_and_stuck_threads() -> None:
    now = [100.0]
    stuck = [0]
    health = Health(stale_after_seconds=30, max_abandoned=2, abandoned=lambda: stuck[0], clock=lambda: now[0])
    assert health.liveness() == (True, "starting") and health.readiness() == (False, "starting")
    health.beat()
    health.started = True
    assert health.liveness() == (True, "ok") and health.readiness() == (True, "ok")
    now[0] += 31
    alive, why = health.liveness()
    assert not alive and "has not run for 31 s" in why and not health.readiness()[0]
    health.beat()
    stuck[0] = 2
    alive, why = health.liveness()
    assert not alive and "2 handler calls timed out" in why
    stuck[0] = 1
    assert health.liveness() == (True, "ok")
