"""Alertmanager notifications -> scale requests: repeats, flapping, conflicts, unknown consumers.

Pure: notifications are built as Alertmanager (webhook version 4) sends them, time is a number.
"""

from __future__ import annotations

from typing import Any

import pytest

from keyrange.autoscale.tracker import (
    AlertTracker,
    ConsumerRef,
    PayloadError,
    Plan,
    parse_payload,
)
from tests.alertmanager import alert, payload

PAYMENTS = ConsumerRef("shop", "payments")
ORDERS = ConsumerRef("shop", "orders")
COOLDOWN = {PAYMENTS: 60.0, ORDERS: 30.0}


class Loop:
    """A tracker plus a controller that applies every request (or refuses them all)."""

    def __init__(self, tracker: AlertTracker | None = None, applies: bool = True) -> None:
        self.tracker = tracker or AlertTracker()
        self.applies = applies
        self.applied: list[tuple[ConsumerRef, str]] = []

    def notify(self, now: float, *alerts: dict[str, Any]) -> Plan:
        plan = self.tracker.plan(parse_payload(payload(*alerts)), now, COOLDOWN.get)
        for request in plan.requests:
            if self.applies:
                self.applied.append((request.consumer, request.direction))
                self.tracker.applied(request, now, COOLDOWN[request.consumer])
        return plan


def outcomes(plan: Plan) -> list[str]:
    return [v.outcome for v in plan.verdicts]


def test_parse_a_v4_payload() -> None:
    alerts = parse_payload(payload(alert(), alert("KeyrangeWorkerDown", status="resolved", scale=None)))
    assert [a.name for a in alerts] == ["KeyrangeLagHighRecords", "KeyrangeWorkerDown"]
    assert alerts[0].consumer == PAYMENTS and alerts[0].direction == "up"
    assert alerts[1].status == "resolved" and alerts[1].direction is None


def test_a_missing_fingerprint_is_derived_from_the_labels() -> None:
    a, b = ({k: v for k, v in alert().items() if k != "fingerprint"} for _ in range(2))
    c = {k: v for k, v in alert(worker="1").items() if k != "fingerprint"}
    fa, fb, fc = (parse_payload(payload(x))[0].fingerprint for x in (a, b, c))
    assert fa == fb != fc


@pytest.mark.parametrize(("doc", "problem"), [
    ([], "expected a JSON object"),
    ({"version": "3", "alerts": []}, "version"),
    ({"version": "4"}, "no `alerts` list"),
    ({"version": "4", "alerts": [{"status": "firing"}]}, "no `labels`"),
    ({"version": "4", "alerts": [{"status": "burning", "labels": {}}]}, "alerts\\[0\\].status"),
])
def test_malformed_payloads_name_the_problem(doc: Any, problem: str) -> None:
    with pytest.raises(PayloadError, match=problem):
        parse_payload(doc)


def test_a_firing_lag_alert_splits_once_and_repeats_are_ignored_within_the_cooldown() -> None:
    loop = Loop()
    first = loop.notify(0, alert())
    assert [(r.consumer, r.direction) for r in first.requests] == [(PAYMENTS, "up")]
    assert "KeyrangeLagHighRecords(worker 0)" in first.requests[0].reason
    for now in (1, 5, 30, 59):
        again = loop.notify(now, alert())
        assert again.requests == [] and outcomes(again) == ["repeat"]
    assert loop.applied == [(PAYMENTS, "up")]
    # Still firing a full cooldown later: one split was not enough, ask for another.
    assert [r.direction for r in loop.notify(61, alert()).requests] == ["up"]
    assert loop.applied == [(PAYMENTS, "up"), (PAYMENTS, "up")]


def test_a_refused_request_is_asked_again_on_the_next_notification() -> None:
    loop = Loop(applies=False)
    assert len(loop.notify(0, alert()).requests) == 1
    assert len(loop.notify(1, alert()).requests) == 1


def test_several_hot_ranges_of_one_consumer_make_one_request() -> None:
    loop = Loop()
    plan = loop.notify(0, alert(worker="0"), alert(worker="1"), alert("KeyrangeLagHighSeconds", worker="2"))
    assert len(plan.requests) == 1
    assert len(plan.requests[0].episodes) == 3
    assert outcomes(loop.notify(1, alert(worker="0"), alert(worker="1"))) == ["repeat", "repeat"]


def test_consumers_are_independent() -> None:
    loop = Loop()
    plan = loop.notify(0, alert(), alert(consumer="orders"), alert(consumer="orders", worker="3"))
    assert sorted((r.consumer, r.direction) for r in plan.requests) == [(ORDERS, "up"), (PAYMENTS, "up")]


def test_merge_waits_while_the_consumer_is_hot_and_up_wins_a_conflict() -> None:
    loop = Loop()
    low = alert("KeyrangeLagLow", scale="down", worker=None)
    both = loop.notify(0, alert(), low)
    assert [r.direction for r in both.requests] == ["up"]
    assert outcomes(both) == ["scale", "recently-hot"]
    loop.notify(10, alert(status="resolved"))
    assert outcomes(loop.notify(40, low)) == ["recently-hot"]    # lag-high seen at 0 s, cooldown 60 s
    assert [r.direction for r in loop.notify(61, low).requests] == ["down"]


def test_merge_repeats_after_the_cooldown_until_the_alert_resolves() -> None:
    loop = Loop()
    low = alert("KeyrangeLagLow", scale="down", worker=None)
    assert len(loop.notify(0, low).requests) == 1
    assert loop.notify(30, low).requests == []
    assert len(loop.notify(60, low).requests) == 1    # still low with workers above min: merge again
    loop.notify(70, alert("KeyrangeLagLow", status="resolved", scale="down", worker=None))
    assert loop.applied == [(PAYMENTS, "down"), (PAYMENTS, "down")]


def test_a_new_episode_after_a_resolution_acts_and_a_late_retry_of_the_old_one_is_stale() -> None:
    loop = Loop()
    loop.notify(0, alert(starts_at="T1"))
    assert outcomes(loop.notify(20, alert(status="resolved", starts_at="T1"))) == ["resolved"]
    assert outcomes(loop.notify(21, alert(starts_at="T1"))) == ["stale"]
    assert outcomes(loop.notify(90, alert(starts_at="T2"))) == ["scale"]


def test_a_flapping_alert_is_ignored_until_it_settles() -> None:
    loop = Loop(AlertTracker(flap_window_seconds=300, flap_threshold=3))
    for i, now in enumerate((0, 100, 200)):
        plan = loop.notify(now, alert(starts_at=f"T{i}"))
        loop.notify(now + 10, alert(status="resolved", starts_at=f"T{i}"))
    assert outcomes(plan) == ["flapping"]
    assert len(loop.applied) == 2
    assert outcomes(loop.notify(250, alert(starts_at="T3"))) == ["flapping"]
    # Quiet for a window: the next episode acts again.
    loop.notify(260, alert(status="resolved", starts_at="T3"))
    assert outcomes(loop.notify(560, alert(starts_at="T4"))) == ["scale"]


def test_unknown_consumers_and_other_alerts_get_verdicts_not_requests() -> None:
    loop = Loop()
    plan = loop.notify(0,
                       alert(consumer="ghost"),
                       alert(namespace="elsewhere"),
                       alert("KeyrangeWorkerDown", scale=None),
                       {"status": "firing", "labels": {"alertname": "Watchdog"}, "startsAt": "T"})
    assert plan.requests == []
    assert outcomes(plan) == ["unknown-consumer", "unknown-consumer", "noted", "noted"]
    assert "shop/ghost" in plan.verdicts[0].detail


def test_state_is_forgotten_after_the_flap_window() -> None:
    tracker = AlertTracker(flap_window_seconds=100)
    loop = Loop(tracker)
    for i in range(1000):
        loop.notify(i, alert(fingerprint=f"fp{i}", starts_at=f"T{i}", worker=str(i)))
        loop.notify(i, alert(status="resolved", fingerprint=f"fp{i}", starts_at=f"T{i}", worker=str(i)))
    assert len(tracker._alerts) <= 102


def test_tracker_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="flap_threshold"):
        AlertTracker(flap_threshold=1)


def test_an_episode_that_stops_being_sent_is_forgotten() -> None:
    tracker = AlertTracker(flap_window_seconds=100)
    loop = Loop(tracker)
    loop.notify(0, alert(fingerprint="silenced"))
    loop.notify(150, alert(fingerprint="other", worker="9"))
    assert "silenced" in tracker._alerts          # still firing as far as we know
    loop.notify(201, alert(fingerprint="other", worker="9"))
    assert "silenced" not in tracker._alerts
