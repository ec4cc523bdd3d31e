"""The handoff's state machine (ranges/handoff.py), transition by transition, on an injected clock.

Every transition of every phase: a split and a merge played through, the slow new worker, the new
owner that does not read ahead, a release that fails, a worker that dies mid-handoff and comes
back, a controller that resumes from the assignment record.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from keyrange.ranges.channel import Prepare, Publication, WorkerReport
from keyrange.ranges.handoff import (
    STUCK_WARNING_MS,
    Action,
    Announce,
    Handoff,
    Phase,
    Publish,
    ScaleFleet,
    Warn,
    advance,
    begin,
)
from keyrange.ranges.planner import Decision
from keyrange.ranges.rangemap import RangeMap

T0 = 1_700_000_000_000
"""The decision's wall-clock time (epoch ms)."""
START_MS, READ_AHEAD_MS = 60_000, 10_000
ONE = RangeMap.even(6, 1, epoch=1)  # w0=0-5
TWO = RangeMap.even(6, 2, epoch=1)  # w0=0-2 w1=3-5
SPLIT = Decision(TWO, "split 0-5: test", "split", frozenset({3, 4, 5}))
MERGE = Decision(RangeMap.even(6, 1, epoch=1), "merge 0-2 and 3-5: test", "merge", frozenset({3, 4, 5}))
Reports = dict[int, WorkerReport]


def report(worker: int, epoch: int, held: set[int], at_ms: int, warm: set[int] | None = None,
           warm_epoch: int = 0) -> WorkerReport:
    return WorkerReport(worker, epoch, frozenset(held), at_ms, 1, frozenset(warm or ()), warm_epoch)


def decided(decision: Decision = SPLIT, current: RangeMap = ONE) -> Handoff:
    """A handoff just begun at T0 from a granted publication of `current`."""
    settled = Handoff.from_storage(Publication(current, reason="initial map", published_ms=T0 - 5_000))
    return begin(settled, decision, T0, "alert", start_timeout_ms=START_MS, read_ahead_timeout_ms=READ_AHEAD_MS)


def step(handoff: Handoff, reports: Reports, now_ms: int) -> tuple[Handoff, tuple[Action, ...]]:
    """One advance, checking that the progress it left is not changed by it (immutable)."""
    before = handoff
    nxt, actions = advance(handoff, reports, now_ms)
    assert handoff == before
    return nxt, actions


def starting_split() -> Handoff:
    handoff, _ = step(decided(), {}, T0)
    assert handoff.phase is Phase.STARTING
    return handoff


def reading_ahead_split(now_ms: int = T0 + 500) -> Handoff:
    handoff, actions = step(starting_split(), {1: report(1, 0, set(), now_ms)}, now_ms)
    assert handoff.phase is Phase.READING_AHEAD and actions == ()
    return handoff


def in_transit_split(now_ms: int = T0 + 1_000) -> Handoff:
    warm = {1: report(1, 1, set(), now_ms, warm={3, 4, 5}, warm_epoch=1)}
    handoff, _ = step(reading_ahead_split(), warm, now_ms)
    assert handoff.phase is Phase.IN_TRANSIT
    return handoff


# --- storage and begin ---------------------------------------------------------------------------

def test_a_publication_without_transit_is_a_granted_handoff() -> None:
    pub = Publication(TWO, published_ms=T0)
    handoff = Handoff.from_storage(pub)
    assert (handoff.phase, handoff.publication, handoff.in_flight, handoff.awaiting) == (
        Phase.GRANTED, pub, False, frozenset())
    assert step(handoff, {}, T0 + 99_000) == (handoff, ())


def test_a_publication_with_slots_in_transit_resumes_in_transit_and_grants_on_the_release() -> None:
    pub = Publication(RangeMap.even(6, 2, epoch=2), frozenset({3, 4, 5}), frozenset({0}), "split", T0)
    handoff = Handoff.from_storage(pub)
    assert (handoff.phase, handoff.in_flight, handoff.awaiting) == (Phase.IN_TRANSIT, True, frozenset({0}))
    granted, actions = step(handoff, {0: report(0, 2, {0, 1, 2}, T0 + 10)}, T0 + 20)
    assert granted.phase is Phase.GRANTED
    assert actions == (Publish(granted.publication), ScaleFleet(2))


def test_begin_plans_the_moves_and_writes_nothing_yet() -> None:
    handoff = decided()
    assert handoff.phase is Phase.PREPARING and handoff.in_flight and handoff.awaiting == frozenset()
    assert handoff.plan is not None
    assert handoff.plan.prepare == Prepare(1, {1: frozenset({3, 4, 5})}, T0)
    assert (handoff.plan.decided_ms, handoff.plan.requested, list(handoff.plan.new_workers)) == (T0, "alert", [1])


def test_begin_refuses_a_second_rescale_and_a_decision_that_moves_nothing() -> None:
    with pytest.raises(ValueError, match="already preparing"):
        begin(decided(), SPLIT, T0, "", start_timeout_ms=START_MS, read_ahead_timeout_ms=READ_AHEAD_MS)
    settled = Handoff.from_storage(Publication(ONE))
    with pytest.raises(ValueError, match="nothing to hand over"):
        begin(settled, Decision(None, "lag is fine"), T0, "", start_timeout_ms=START_MS,
              read_ahead_timeout_ms=READ_AHEAD_MS)


# --- PREPARING -> STARTING -----------------------------------------------------------------------

def test_preparing_announces_the_moves_and_starts_the_new_worker_before_anything_else() -> None:
    handoff = decided()
    starting, actions = step(handoff, {}, T0 + 3)
    assert handoff.plan is not None
    assert actions == (Announce(handoff.plan.prepare), ScaleFleet(2))
    assert (starting.phase, starting.entered_ms, starting.deadline_ms) == (Phase.STARTING, T0 + 3, T0 + START_MS)
    assert starting.publication == handoff.publication  # nothing is published yet


def test_a_merge_keeps_every_worker_running_until_the_grant() -> None:
    _, actions = step(decided(MERGE, TWO), {}, T0)
    assert ScaleFleet(2) in actions


# --- STARTING ------------------------------------------------------------------------------------

def test_a_split_waits_for_its_new_worker_to_report() -> None:
    handoff = starting_split()
    assert step(handoff, {}, T0 + 5_000) == (handoff, ())
    # A report from before the decision's slack is an earlier run of that ordinal, not this one.
    stale = {1: report(1, 0, set(), T0 - 2_001)}
    assert step(handoff, stale, T0 + 5_000) == (handoff, ())
    # A standby worker that heartbeat just before the decision runs.
    reading, actions = step(handoff, {1: report(1, 0, set(), T0 - 2_000)}, T0 + 5_000)
    assert actions == ()
    assert (reading.phase, reading.entered_ms, reading.deadline_ms) == (
        Phase.READING_AHEAD, T0 + 5_000, T0 + 5_000 + READ_AHEAD_MS)


def test_a_new_worker_that_never_reports_is_published_anyway_at_the_start_timeout() -> None:
    handoff = starting_split()
    assert step(handoff, {}, T0 + START_MS - 1) == (handoff, ())
    reading, actions = step(handoff, {}, T0 + START_MS)
    assert reading.phase is Phase.READING_AHEAD
    assert actions == (Warn("worker(s) [1] did not report within 60 s; publishing anyway"),)


def test_a_slow_new_worker_still_gets_its_whole_read_ahead_time() -> None:
    # It reports 59 s after the decision: the read-ahead wait counts from then, not from the decision.
    handoff = starting_split()
    reading, _ = step(handoff, {1: report(1, 0, set(), T0 + 59_000)}, T0 + 59_000)
    assert reading.deadline_ms == T0 + 59_000 + READ_AHEAD_MS
    assert step(reading, {}, T0 + 59_000 + READ_AHEAD_MS - 1) == (reading, ())


def test_a_merge_has_no_new_worker_to_wait_for() -> None:
    starting, _ = step(decided(MERGE, TWO), {}, T0)
    reading, actions = step(starting, {}, T0 + 1)
    assert (reading.phase, actions) == (Phase.READING_AHEAD, ())


# --- READING_AHEAD -------------------------------------------------------------------------------

def test_the_epoch_is_published_once_every_new_owner_read_the_moved_slots_ahead() -> None:
    handoff = reading_ahead_split()
    partly = {1: report(1, 1, set(), T0 + 900, warm={3, 4}, warm_epoch=1)}
    assert step(handoff, partly, T0 + 1_000) == (handoff, ())
    other_prepare = {1: report(1, 1, set(), T0 + 900, warm={3, 4, 5}, warm_epoch=0)}
    assert step(handoff, other_prepare, T0 + 1_000) == (handoff, ())
    warm = {1: report(1, 1, set(), T0 + 900, warm={3, 4, 5}, warm_epoch=1)}
    transit, actions = step(handoff, warm, T0 + 1_000)
    expected = Publication(RangeMap.even(6, 2, epoch=2), frozenset({3, 4, 5}), frozenset({0}), "split 0-5: test",
                           T0 + 1_000)
    assert handoff.plan is not None
    assert actions == (Publish(expected, handoff.plan),)
    assert (transit.phase, transit.publication, transit.plan, transit.awaiting) == (
        Phase.IN_TRANSIT, expected, None, frozenset({0}))


def test_a_new_owner_that_does_not_read_ahead_in_time_is_handed_over_anyway() -> None:
    # Slow, or dead before it reported its read-ahead: its acquire restores what is missing.
    handoff = reading_ahead_split(T0 + 500)
    assert step(handoff, {}, T0 + 500 + READ_AHEAD_MS - 1) == (handoff, ())
    transit, actions = step(handoff, {}, T0 + 500 + READ_AHEAD_MS)
    assert transit.phase is Phase.IN_TRANSIT
    assert [type(a) for a in actions] == [Warn, Publish]
    assert actions[0] == Warn("worker(s) [1] did not read ahead within 10 s; handing over anyway (their acquire "
                              "finishes the read-ahead, or restores in full if it failed); w1: no report")
    assert isinstance(actions[1], Publish) and actions[1].cold == (1,)  # the controller records the wait


def test_the_read_ahead_warning_says_what_each_cold_worker_last_reported() -> None:
    # Tells a worker that went silent from one that reports without having read the slots ahead.
    handoff = reading_ahead_split(T0 + 500)
    stale = {1: report(1, 1, set(), T0 + 400, warm={3, 4}, warm_epoch=0)}
    _, actions = step(handoff, stale, T0 + 500 + READ_AHEAD_MS)
    assert isinstance(actions[0], Warn)
    assert actions[0].message.endswith("; w1: last report 10.1 s ago at epoch 1, read ahead 3-4 for epoch 0")


def test_the_read_ahead_warning_tells_a_worker_that_never_read_the_prepare_from_one_that_did() -> None:
    # The first points at its control reader (how far it read), the second at its read-ahead.
    handoff = reading_ahead_split(T0 + 500)
    assert handoff.plan is not None and handoff.plan.prepare.epoch == 1
    unread = {1: replace(report(1, 1, set(), T0 + 9_900), prepare_epoch=0, read_to=41)}
    _, actions = step(handoff, unread, T0 + 500 + READ_AHEAD_MS)
    assert isinstance(actions[0], Warn)
    assert actions[0].message.endswith("; w1: last report 0.6 s ago at epoch 1, read ahead nothing for epoch 0, "
                                       "had not read the prepare of epoch 1 (its newest: epoch 0; control topic "
                                       "read to offset 41)")
    read = {1: replace(report(1, 1, set(), T0 + 9_900), prepare_epoch=1, read_to=44)}
    _, actions = step(handoff, read, T0 + 500 + READ_AHEAD_MS)
    assert isinstance(actions[0], Warn)
    assert actions[0].message.endswith("read ahead nothing for epoch 0, had read the prepare of epoch 1")


# --- IN_TRANSIT ----------------------------------------------------------------------------------

def test_the_grant_waits_for_every_awaited_worker_to_report_the_epoch_without_the_slots() -> None:
    handoff = in_transit_split(T0 + 1_000)
    assert step(handoff, {}, T0 + 2_000) == (handoff, ())
    older_epoch = {0: report(0, 1, {0, 1, 2, 3, 4, 5}, T0 + 1_500)}
    assert step(handoff, older_epoch, T0 + 2_000) == (handoff, ())
    granted, actions = step(handoff, {0: report(0, 2, {0, 1, 2}, T0 + 1_800)}, T0 + 2_000)
    expected = Publication(RangeMap.even(6, 2, epoch=3), reason="handoff of epoch 2 complete", published_ms=T0 + 2_000)
    assert actions == (Publish(expected), ScaleFleet(2))
    assert (granted.phase, granted.publication, granted.in_flight) == (Phase.GRANTED, expected, False)


def test_a_release_that_fails_never_lets_the_grant_through() -> None:
    # The old owner applied the epoch but still holds a moved slot (its commit failed), then dies
    # and its last report is of the older epoch; only its restart, holding none of them, grants.
    handoff = in_transit_split(T0 + 1_000)
    still_held = {0: report(0, 2, {0, 1, 2, 5}, T0 + 1_500)}
    assert step(handoff, still_held, T0 + 2_000) == (handoff, ())
    died = {0: report(0, 1, set(), T0 + 3_000)}
    assert step(handoff, died, T0 + 4_000) == (handoff, ())
    granted, actions = step(handoff, {0: report(0, 2, {0, 1, 2}, T0 + 9_000)}, T0 + 9_000)
    assert granted.phase is Phase.GRANTED and isinstance(actions[0], Publish)


def test_a_worker_that_reported_a_newer_epoch_has_released_too() -> None:
    handoff = in_transit_split(T0 + 1_000)
    granted, _ = step(handoff, {0: report(0, 7, set(), T0 + 1_500)}, T0 + 2_000)
    assert granted.phase is Phase.GRANTED


def test_an_old_owner_that_dies_mid_handoff_is_logged_every_30_s_and_granted_once_back() -> None:
    # The old owner died in its release: its report gets older while the new owner heartbeats.
    handoff = in_transit_split(T0 + 1_000)
    published = handoff.publication.published_ms
    reports = {0: report(0, 1, {0, 1, 2, 3, 4, 5}, published - 100), 1: report(1, 1, set(), published)}
    assert step(handoff, reports, published + STUCK_WARNING_MS) == (handoff, ())
    now = published + STUCK_WARNING_MS + 1
    reports[1] = report(1, 1, set(), now - 300)
    warned, actions = step(handoff, reports, now)
    assert actions == (Warn("handoff of epoch 2 waits for 30 s; reports: w0@1[0-5] 30.1s ago w1@1[] 0.3s ago"),)
    assert (warned.phase, warned.warned_ms) == (Phase.IN_TRANSIT, now)
    assert step(warned, reports, now + STUCK_WARNING_MS) == (warned, ())
    again, actions = step(warned, reports, now + STUCK_WARNING_MS + 1)
    assert again.warned_ms == now + STUCK_WARNING_MS + 1 and len(actions) == 1
    # Restarted, it applies the epoch holding nothing, and the handoff completes.
    reports[0] = report(0, 2, set(), now + 40_000)
    granted, _ = step(again, reports, now + 40_000)
    assert granted.phase is Phase.GRANTED


# --- whole handoffs --------------------------------------------------------------------------------

def test_a_merge_frees_its_top_worker_only_with_the_grant() -> None:
    handoff, log = decided(MERGE, TWO), list[Action]()
    reports: Reports = {0: report(0, 1, {0, 1, 2}, T0, warm={3, 4, 5}, warm_epoch=1)}
    for now in (T0, T0 + 1, T0 + 2):
        handoff, actions = step(handoff, reports, now)
        log.extend(actions)
    assert handoff.phase is Phase.IN_TRANSIT and handoff.awaiting == {1}
    reports[1] = report(1, 2, set(), T0 + 50)
    handoff, actions = step(handoff, reports, T0 + 60)
    log.extend(actions)
    assert [type(a).__name__ for a in log] == ["Announce", "ScaleFleet", "Publish", "Publish",
                                               "ScaleFleet"]
    assert log[1] == ScaleFleet(2) and log[-1] == ScaleFleet(1)
    assert handoff.publication.map.epoch == 3 and handoff.publication.map.workers == 1


def test_a_transition_whose_actions_failed_is_made_again_from_the_same_progress() -> None:
    # The controller adopts a progress only once its actions are done: advancing the old one again
    # gives the same writes (an announce that timed out is announced again, the fleet scaled again).
    handoff = decided()
    first = step(handoff, {}, T0 + 1)
    assert step(handoff, {}, T0 + 1) == first
