"""Status rendering: phase, conditions with stable transition times, range map and lag."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from keyrange.operator.rangecontrol import RangeStatus
from keyrange.operator.status import Observed, changed_fields, render_status, scaling_record

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
RANGES = RangeStatus(epoch=7, workers=2, ranges=((0, "0-5"), (1, "6-11")), lag_records=42, lag_seconds=0.5)


def _conditions(status: dict) -> dict:  # type: ignore[type-arg]
    return {c["type"]: c for c in status["conditions"]}


def test_running_when_all_workers_are_ready() -> None:
    status = render_status(Observed(3, 2, 2, "a=b"), RANGES, T0)
    assert status["phase"] == "Running"
    assert status["epoch"] == 7 and status["workers"] == 2 and status["rangeCount"] == 2
    assert status["ranges"] == [{"worker": 0, "slots": "0-5"}, {"worker": 1, "slots": "6-11"}]
    assert status["lag"] == {"records": 42, "seconds": 0.5}
    assert status["observedGeneration"] == 3 and status["selector"] == "a=b"
    c = _conditions(status)
    assert c["Ready"]["status"] == "True" and c["Scaling"]["status"] == "False"
    assert c["Degraded"]["status"] == "False" and c["Degraded"]["reason"] == "AsExpected"


def test_pending_then_scaling_up_then_down_then_handoff() -> None:
    assert render_status(Observed(1, 2, 0, "s"), None, T0)["phase"] == "Pending"
    up = render_status(Observed(1, 3, 2, "s"), RANGES, T0)
    assert up["phase"] == "Scaling" and _conditions(up)["Scaling"]["reason"] == "ScalingUp"
    down = render_status(Observed(1, 1, 1, "s"), RANGES, T0)
    assert down["phase"] == "Scaling" and _conditions(down)["Scaling"]["reason"] == "ScalingDown"
    moving = RangeStatus(epoch=8, workers=2, ranges=RANGES.ranges, handoff_in_progress=True)
    handoff = render_status(Observed(1, 2, 2, "s"), moving, T0)
    assert _conditions(handoff)["Scaling"]["reason"] == "Handoff"
    assert _conditions(handoff)["Ready"]["status"] == "False"


def test_pending_until_the_controller_publishes_and_degraded_when_it_cannot() -> None:
    starting = render_status(Observed(1, 2, 2, "s"), RangeStatus(epoch=0, workers=2), T0)
    assert starting["phase"] == "Pending" and _conditions(starting)["Ready"]["reason"] == "ControllerStarting"
    broken = RangeStatus(epoch=0, workers=2, problem="cannot reach Kafka at k:9092")
    status = render_status(Observed(1, 2, 2, "s"), broken, T0)
    degraded = _conditions(status)["Degraded"]
    assert status["phase"] == "Degraded" and degraded["status"] == "True"
    assert degraded["reason"] == "ControllerUnavailable" and "cannot reach Kafka" in degraded["message"]


def test_degraded_carries_the_reason_and_message() -> None:
    status = render_status(Observed(4, 0, 0, "s", error="spec.workers.min: too big"), None, T0)
    c = _conditions(status)
    assert status["phase"] == "Degraded"
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "InvalidSpec"
    assert c["Degraded"]["message"] == "spec.workers.min: too big"
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "InvalidSpec"
    assert all(x["observedGeneration"] == 4 for x in status["conditions"])


def test_transition_time_moves_only_when_the_status_flips() -> None:
    first = render_status(Observed(1, 2, 2, "s"), RANGES, T0)
    later = render_status(Observed(1, 2, 2, "s"), RANGES, T0 + timedelta(minutes=5), first)
    assert later["conditions"] == first["conditions"]
    assert changed_fields(later, first) == {}
    flipped = render_status(Observed(1, 3, 2, "s"), RANGES, T0 + timedelta(minutes=6), later)
    ready = _conditions(flipped)["Ready"]
    assert ready["status"] == "False" and ready["lastTransitionTime"] == "2026-01-01T12:06:00Z"
    assert _conditions(flipped)["Degraded"]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert set(changed_fields(flipped, later)) == {"phase", "conditions"}


def test_scaling_record() -> None:
    assert scaling_record(2, 3, "KeyrangeLagHighRecords", "split", T0) == {
        "time": "2026-01-01T12:00:00Z", "fromWorkers": 2, "toWorkers": 3,
        "reason": "KeyrangeLagHighRecords", "message": "split"}


def test_suspending_then_suspended_keeps_the_map_and_drops_lag() -> None:
    suspending = render_status(Observed(4, 0, 1, "s", suspended=True, pods=2), None, T0)
    assert suspending["phase"] == "Scaling" and _conditions(suspending)["Scaling"]["reason"] == "Suspending"
    assert _conditions(suspending)["Ready"]["reason"] == "Suspended"
    suspended = render_status(Observed(4, 0, 0, "s", suspended=True, pods=0), None, T0)
    assert suspended["phase"] == "Suspended" and suspended["workers"] == 0 and suspended["lag"] is None
    c = _conditions(suspended)
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "Suspended"
    assert c["Degraded"]["status"] == "False"
    previous = render_status(Observed(3, 2, 2, "s"), RANGES, T0)
    patch = changed_fields(suspended, previous)
    assert "ranges" not in patch and "epoch" not in patch  # the map they resume with stays
    assert patch["lag"] is None and patch["workers"] == 0  # a merge patch's null removes lag


def test_the_newest_handoff_and_its_pause() -> None:
    from keyrange.operator.rangecontrol import HandoffSummary

    moved = RangeStatus(epoch=9, workers=2, ranges=RANGES.ranges,
                        last_handoff=HandoffSummary(epoch=9, pause_seconds=0.0854, worker=1, at_ms=1_767_268_800_000))
    status = render_status(Observed(1, 2, 2, "s"), moved, T0)
    assert status["lastHandoff"] == {"epoch": 9, "pauseSeconds": 0.085, "worker": 1, "time": "2026-01-01T12:00:00Z"}
    assert "lastHandoff" not in render_status(Observed(1, 2, 2, "s"), RANGES, T0)


def test_status_says_whether_events_are_deduplicated() -> None:
    assert render_status(Observed(1, 2, 2, "s", deduplication=False), RANGES, T0)["deduplication"] == "off"
    assert render_status(Observed(1, 2, 2, "s", deduplication=True), RANGES, T0)["deduplication"] == "on"
    assert "deduplication" not in render_status(Observed(1, 0, 0, "s", error="bad spec"), None, T0)


def test_status_shows_the_ranges_as_partitions_and_hash_ranges() -> None:
    from keyrange.operator.rangecontrol import map_status
    from keyrange.ranges.layout import SlotLayout
    from keyrange.ranges.rangemap import RangeMap

    # Two partitions cut in quarters for workers.max 8, now at 3 workers.
    ranges = RangeStatus(**map_status(RangeMap.even(8, 3, epoch=5), SlotLayout(2, 4)))
    status = render_status(Observed(1, 3, 3, "s"), ranges, T0)
    assert status["ranges"] == [{"worker": 0, "slots": "0-2", "partitions": "0:0-2/4"},
                                {"worker": 1, "slots": "3-5", "partitions": "0:3/4-1:1/4"},
                                {"worker": 2, "slots": "6-7", "partitions": "1:2-3/4"}]
    assert status["rangeMap"] == "w0=0:0-2/4 w1=0:3/4-1:1/4 w2=1:2-3/4" and status["rangeCount"] == 3
    whole = render_status(Observed(1, 2, 2, "s"), RangeStatus(**map_status(RangeMap.even(12, 2), SlotLayout(12))), T0)
    assert whole["rangeMap"] == "w0=0-5 w1=6-11"
    assert whole["ranges"][1] == {"worker": 1, "slots": "6-11", "partitions": "6-11"}
