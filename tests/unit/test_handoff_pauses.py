"""The handoff pause, measured at the new owner's first event (ranges/pauses.py), and its place in
the worker's control-topic report."""

from __future__ import annotations

from prometheus_client import REGISTRY

from keyrange.ranges.channel import WorkerReport
from keyrange.ranges.pauses import HandoffPause, HandoffPauses


def _count(worker: str) -> float:
    labels = {"consumer": "pauses-test", "worker": worker}
    return REGISTRY.get_sample_value("keyrange_handoff_pause_seconds_count", labels) or 0.0


def test_the_first_event_of_a_moved_slot_measures_from_the_transit() -> None:
    pauses = HandoffPauses("pauses-test", "a")
    pauses.expect(3, transit_published_ms=10_000, grant_epoch=5)
    pauses.started(2, 10.5, created_ms=9_000)  # another slot: not a moved one
    assert pauses.last is None
    pauses.started(3, 10.250, created_ms=9_000)  # created before the transit: waited since it
    assert pauses.last == HandoffPause(epoch=5, pause_ms=250, at_ms=10_250)
    pauses.started(3, 11.0, created_ms=9_000)  # only the first event counts
    assert pauses.last.pause_ms == 250
    assert _count("a") == 1


def test_an_event_created_after_the_transit_waited_only_since_its_creation() -> None:
    pauses = HandoffPauses("pauses-test", "b")
    pauses.expect(0, transit_published_ms=10_000, grant_epoch=2)
    pauses.started(0, 60.010, created_ms=60_000)  # an idle slot: its next event came a minute later
    assert pauses.last is not None and pauses.last.pause_ms == 10


def test_one_grant_reports_its_largest_pause_and_a_newer_grant_replaces_it() -> None:
    pauses = HandoffPauses("pauses-test", "c")
    for slot in (1, 2):
        pauses.expect(slot, 1_000, grant_epoch=4)
    pauses.started(2, 1.300, 0)
    pauses.started(1, 1.100, 0)
    assert pauses.last == HandoffPause(4, 300, 1_300)
    pauses.expect(5, 5_000, grant_epoch=8)
    pauses.started(5, 5.040, 0)
    assert pauses.last == HandoffPause(8, 40, 5_040)


def test_a_slot_released_before_its_first_event_is_not_measured() -> None:
    pauses = HandoffPauses("pauses-test", "d")
    pauses.expect(1, 1_000, grant_epoch=4)
    pauses.forget([1])
    pauses.started(1, 9.0, 0)
    assert pauses.last is None and _count("d") == 0


def test_the_report_carries_the_pause_and_older_reports_still_parse() -> None:
    report = WorkerReport(1, 7, frozenset({0, 1}), 123, 9, pause=HandoffPause(7, 85, 120))
    assert WorkerReport.decode(report.encode()) == report
    older = b'{"worker": 1, "epoch": 7, "held": "0-1", "at": 123}'
    assert WorkerReport.decode(older).pause is None
