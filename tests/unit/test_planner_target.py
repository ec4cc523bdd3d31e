"""The `target` policy with an injected clock: size in one decision, merge with headroom, no flapping."""

from collections.abc import Mapping

import pytest

from keyrange.ranges.planner import SETTLE_SECONDS, Planner, ScalingLimits, SlotLag
from keyrange.ranges.rangemap import RangeMap, SlotRange
from keyrange.ranges.sizing import Load, WorkerLoad
from keyrange.spec import parse_spec

LIMITS = ScalingLimits(min_workers=1, max_workers=6, lag_high_records=5000, lag_high_seconds=5.0,
                       lag_low_records=100, cooldown_seconds=20.0)

CAUGHT_UP = {s: SlotLag() for s in range(12)}
"""Every slot of a 12-slot map measured, none behind (a slot nobody measures blocks merges)."""

def load(current: RangeMap, per_slot: float, capacity: float = 800.0,
         handled: Mapping[int, float] | None = None) -> Load:
    """`per_slot` ev/s into every slot; each worker handles its slots' input (or `handled`), its
    permits busy in proportion to a true capacity of `capacity`."""
    workers = {}
    for a in current.assignments:
        rate = handled.get(a.worker, 0.0) if handled else per_slot * a.range.size
        workers[a.worker] = WorkerLoad(rate, permits_busy=min(1.0, rate / capacity))
    return Load({s: per_slot for s in range(current.slot_count)}, workers)


def merged_to_one(planner: Planner, current: RangeMap, per_slot: float, capacity: float) -> RangeMap:
    """The map after `planner` merged `current` to one worker: `per_slot` ev/s into each slot, caught up,
    for its stabilization window."""
    planner.decide(current, CAUGHT_UP, now=0, load=load(current, per_slot, capacity=capacity))
    window = planner.limits.cooldown_seconds
    down = planner.decide(current, CAUGHT_UP, now=window, load=load(current, per_slot, capacity=capacity))
    assert down.next_map is not None and down.next_map.workers == 1
    return down.next_map


def test_a_burst_splits_to_the_size_it_needs_in_one_decision() -> None:
    current = RangeMap.even(12, 1)
    # 3,000 ev/s arrive, the one worker handles 800 (all permits busy) and falls behind
    lag = {s: SlotLag(400, 3.0) for s in range(12)}
    d = Planner(LIMITS).decide(current, lag, now=0, load=load(current, 250, handled={0: 800}))
    assert d.action == "split" and d.next_map is not None
    assert d.next_map.workers == 6
    assert {a.range.size for a in d.next_map.assignments} == {2}
    assert "to 6 workers" in d.reason and "800 ev/s per worker" in d.reason


def test_the_size_counts_whole_slots_and_the_backlog() -> None:
    current = RangeMap.even(12, 1)
    # 1,200 ev/s: 2 workers would do at 75 % ...
    fits = Planner(LIMITS).decide(current, CAUGHT_UP, now=0, load=load(current, 100, handled={0: 800}))
    assert fits.next_map is not None and fits.next_map.workers == 2
    # ... but 6,000 records behind must drain within lagHighSeconds: 2,400 ev/s, 4 workers
    behind = {s: SlotLag(500, 3.0) for s in range(12)}
    more = Planner(LIMITS).decide(current, behind, now=0, load=load(current, 100, handled={0: 800}))
    assert more.next_map is not None and more.next_map.workers == 4


def test_a_single_hot_slot_gets_a_range_of_its_own_not_the_maximum() -> None:
    current = RangeMap.even(12, 1)
    rates = {0: 1500.0, **{s: 20.0 for s in range(1, 12)}}
    behind = {0: SlotLag(2000, 3.0)}
    d = Planner(LIMITS).decide(current, behind, now=0,
                               load=Load(rates, {0: WorkerLoad(800, permits_busy=1.0)}))
    assert d.next_map is not None and d.next_map.workers == 2
    assert d.next_map.range_of(d.next_map.owner_of(0)) == SlotRange(0, 0)
    alone = Planner(LIMITS).decide(d.next_map, behind, now=0,
                                   load=Load(rates, {0: WorkerLoad(800, permits_busy=1.0),
                                                     1: WorkerLoad(220, permits_busy=0.3)}))
    assert alone.next_map is None and "single slot" in alone.reason


def test_no_rescale_while_the_workers_have_capacity() -> None:
    current = RangeMap.even(12, 2)
    d = Planner(LIMITS).decide(current, CAUGHT_UP, now=0, load=load(current, 60))  # 360 of 800 ev/s per worker
    assert d.next_map is None and "capacity is fine" in d.reason


def test_a_second_split_follows_after_the_settle_time_not_the_cooldown() -> None:
    planner = Planner(LIMITS)
    current = RangeMap.even(12, 1)
    first = planner.decide(current, CAUGHT_UP, now=0, load=load(current, 100, handled={0: 800}))
    assert first.next_map is not None and first.next_map.workers == 2
    current = first.next_map
    # the input grew again: each worker handles 500 but 1,200 each arrive
    heavier = load(current, 200, handled={0: 500, 1: 500})
    behind = {s: SlotLag(200, 2.0) for s in range(12)}
    early = planner.decide(current, behind, now=1, load=heavier)
    assert early.next_map is None and early.reason.startswith("settling")
    later = planner.decide(current, behind, now=1 + SETTLE_SECONDS, load=heavier)
    assert later.action == "split" and later.next_map is not None and later.next_map.workers == 6


def test_merge_needs_headroom_for_the_whole_window_and_goes_there_at_once() -> None:
    planner = Planner(LIMITS)
    current = RangeMap.even(12, 6)
    quiet = load(current, 25)  # 300 ev/s: one worker stays at 37 %
    assert planner.decide(current, CAUGHT_UP, now=0, load=quiet).next_map is None
    # a blip that 1 worker could not keep within 70 % (600 of 800 ev/s), 2 could
    blip = planner.decide(current, CAUGHT_UP, now=10, load=load(current, 50))
    assert blip.next_map is None
    waiting = planner.decide(current, CAUGHT_UP, now=19, load=quiet)
    assert waiting.next_map is None and "merging in 1 s" in waiting.reason
    d = planner.decide(current, CAUGHT_UP, now=20, load=quiet)
    assert d.action == "merge" and d.next_map is not None
    assert d.next_map.workers == 2  # the largest size the window needed, not one step
    assert sorted(a.worker for a in d.next_map.assignments) == [0, 1]


def test_load_above_the_headroom_restarts_the_merge_window() -> None:
    planner = Planner(LIMITS)
    current = RangeMap.even(12, 2)
    quiet = load(current, 25)
    planner.decide(current, CAUGHT_UP, now=0, load=quiet)
    # 600 ev/s: one worker would be at 75 %, above the 70 % headroom
    planner.decide(current, CAUGHT_UP, now=15, load=load(current, 50))
    assert planner.decide(current, CAUGHT_UP, now=25, load=quiet).next_map is None
    assert planner.decide(current, CAUGHT_UP, now=44, load=quiet).next_map is None
    d = planner.decide(current, CAUGHT_UP, now=45, load=quiet)
    assert d.action == "merge" and d.next_map is not None and d.next_map.workers == 1


def test_no_split_from_a_handoffs_own_pause() -> None:
    planner = Planner(LIMITS)
    current = RangeMap.even(12, 1)
    up = planner.decide(current, CAUGHT_UP, now=0, load=load(current, 100, handled={0: 800}))
    assert up.next_map is not None
    current, moved = up.next_map, up.moved_slots
    # after the handoff the moved slots carry its pause: old events, thousands of records, and their
    # new owner's rate is not yet its own
    paused = {s: SlotLag(2000, 8.0) for s in moved}
    handled = {a.worker: (0.0 if set(a.range.slots) & moved else 600.0) for a in current.assignments}
    after = planner.decide(current, paused, now=SETTLE_SECONDS + 10, load=load(current, 100, handled=handled))
    assert after.next_map is None and "capacity is fine" in after.reason
    assert planner.paused_slots(SETTLE_SECONDS + 10) == moved
    assert planner.capacity == 800  # the moved slots' owner did not change the estimate
    # the same lag once the settle time passed is real backlog
    assert planner.paused_slots(SETTLE_SECONDS + 10 + LIMITS.settle_seconds) == frozenset()


def test_the_demos_flap_does_not_happen() -> None:
    """The demo's quiet phase: 2 workers at 300 ev/s merge to 1; the merge's slow handoff (11 s)
    leaves 1,450 records 11.2 s old on the moved slots, which the workers keep reporting; the
    step planner split on that lag 25 s later and merged again 21 s after (2 -> 1 -> 2 -> 1)."""
    planner = Planner(LIMITS)
    current = RangeMap.even(12, 2)
    sizes, now, handoff_until = [current.workers], 0.0, None
    moved: frozenset[int] = frozenset()
    while now < 120:
        if handoff_until is not None and now < handoff_until:
            now += 1  # the controller decides nothing while a handoff is in flight
            continue
        lag = {**CAUGHT_UP, **{s: SlotLag(1450 // max(1, len(moved)), 11.2) for s in moved}}
        d = planner.decide(current, lag, now, load=load(current, 25))
        if d.next_map is not None:
            current, moved, handoff_until = d.next_map, d.moved_slots, now + 11
            sizes.append(current.workers)
        now += 1
    assert sizes == [2, 1]


def test_a_split_soon_after_a_merge_needs_the_rate_short_of_capacity() -> None:
    planner = Planner(LIMITS)
    current = RangeMap.even(12, 2)
    planner.decide(current, CAUGHT_UP, now=0, load=load(current, 25))
    down = planner.decide(current, CAUGHT_UP, now=20, load=load(current, 25))
    assert down.next_map is not None and down.next_map.workers == 1
    current = down.next_map
    backlog = {s: SlotLag(1000, 4.0) for s in range(12)}
    # the first decision after the handoff: its rates settle first, whatever they read
    settling = planner.decide(current, backlog, now=30, load=load(current, 100, handled={0: 800}))
    assert settling.next_map is None and "settle first" in settling.reason
    settled = 30 + LIMITS.settle_seconds
    # lag alone (backlog over budget, rate fits: 600 of 800 ev/s) does not undo the merge ...
    lagging = planner.decide(current, backlog, now=settled, load=load(current, 50))
    assert lagging.next_map is None and "rate fits" in lagging.reason
    # ... a rate the merged size cannot handle does
    short = planner.decide(current, backlog, now=settled + 1, load=load(current, 100, handled={0: 800}))
    assert short.action == "split"


def test_rates_read_across_a_merges_handoff_do_not_split_it_again() -> None:
    """Seen on tansu (test_target_sizing): 3 workers at 54 ev/s merged to one (capacity 177 ev/s);
    1.2 s after the handoff the 5 s rate window, spanning the old owners' last counts, the pause and
    the new owner's catch-up, read 283 ev/s in, and the planner split to 3 again (3 -> 1 -> 3)."""
    planner = Planner(LIMITS)
    current = merged_to_one(planner, RangeMap.even(12, 3), 54 / 12, 177)
    spanning = Load({s: 283 / 12 for s in range(12)}, {0: WorkerLoad(150, permits_busy=0.85)})
    resumed = LIMITS.cooldown_seconds + 10  # the first decision after the handoff
    for now in (resumed, resumed + 1.2, resumed + LIMITS.settle_seconds - 0.1):
        d = planner.decide(current, CAUGHT_UP, now=now, load=spanning)
        assert d.next_map is None, d.reason
    quiet = planner.decide(current, CAUGHT_UP, now=resumed + LIMITS.settle_seconds,
                           load=load(current, 60 / 12, capacity=177))
    assert quiet.next_map is None, quiet.reason
    # a true rise past the capacity the merge was sized on still splits
    rise = planner.decide(current, CAUGHT_UP, now=resumed + LIMITS.settle_seconds + 1,
                          load=load(current, 283 / 12, capacity=177, handled={0: 177}))
    assert rise.action == "split", rise.reason


def test_an_idle_worker_whose_events_wait_after_a_merge_does_not_split_it_again() -> None:
    """Seen on tansu: right after a merge to one worker, its events waited (91 records, 3 s) while it
    handled 20 ev/s with its permits 10 % busy; taking that for its capacity split to 4 workers."""
    planner = Planner(LIMITS)
    current = merged_to_one(planner, RangeMap.even(12, 2), 5, 200)
    waiting = {s: SlotLag(8, 3.0) for s in range(12)}
    idle = Load({s: 40 / 12 for s in range(12)}, {0: WorkerLoad(20, permits_busy=0.1)})
    for now in (35, 40, 45):
        d = planner.decide(current, waiting, now=now, load=idle)
        assert d.next_map is None, d.reason
    assert planner.capacity == 200


def test_without_a_measurement_the_target_policy_steps() -> None:
    current = RangeMap.even(12, 1)
    d = Planner(LIMITS).decide(current, {s: SlotLag(1000) for s in range(12)}, now=0)
    assert d.action == "split" and d.next_map is not None and d.next_map.workers == 2


def test_the_step_policy_ignores_the_load() -> None:
    step = ScalingLimits(min_workers=1, max_workers=6, cooldown_seconds=20.0, policy="step")
    current = RangeMap.even(12, 1)
    d = Planner(step).decide(current, {s: SlotLag(1000) for s in range(12)}, now=0,
                             load=load(current, 250, handled={0: 800}))
    assert d.action == "split" and d.next_map is not None and d.next_map.workers == 2


def test_the_policy_comes_from_the_spec_and_defaults_to_target() -> None:
    assert ScalingLimits.from_spec(parse_spec({"kafka": {"topic": "t"}})).policy == "target"
    step = parse_spec({"kafka": {"topic": "t"}, "scaling": {"policy": "step"}})
    assert ScalingLimits.from_spec(step).policy == "step"
    with pytest.raises(ValueError, match="policy"):
        parse_spec({"kafka": {"topic": "t"}, "scaling": {"policy": "fast"}})


def test_no_sizing_while_every_worker_is_warming_up() -> None:
    """`keyrange demo`'s start on a busy machine: the one worker, seconds old, handled 46 ev/s of
    250 and was 1,049 records behind; sized on that it split 1 -> 4, and merged back within 20 s.
    A worker's first seconds say nothing of its capacity: the planner waits for a measure, and does
    not fall back to splitting on lag meanwhile."""
    planner = Planner(LIMITS)
    current = RangeMap.even(12, 1)
    behind = {s: SlotLag(90, 5.4) for s in range(12)}
    warming = Load({s: 2.5 for s in range(12)}, {}, warming=frozenset({0}))
    d = planner.decide(current, behind, now=0, load=warming)
    assert d.next_map is None and "warming up" in d.reason and "worker 0" in d.reason
    # once measured, it sizes: 250 ev/s in, 1,080 behind to drain in 5 s, 380 ev/s per worker
    measured = Load({s: 250 / 12 for s in range(12)}, {0: WorkerLoad(380, permits_busy=1.0)})
    sized = planner.decide(current, behind, now=1, load=measured)
    assert sized.next_map is not None and sized.next_map.workers == 2


def just_short_after_a_merge() -> tuple[Planner, RangeMap, dict[int, SlotLag], Load]:
    """test_target_sizing's planner (cooldown 10 s) just merged four workers of 200 ev/s to one, and the
    lag and load of the merged worker falling just short: 59 ev/s handled of 62, its events 1.5 s old."""
    limits = ScalingLimits(min_workers=1, max_workers=4, lag_high_seconds=5.0, cooldown_seconds=10.0)
    planner = Planner(limits)
    current = merged_to_one(planner, RangeMap.even(12, 4), 5, 200)
    behind = {s: SlotLag(10, 1.5) for s in range(12)}
    short = Load({s: 62 / 12 for s in range(12)}, {0: WorkerLoad(59, permits_busy=0.6)})
    return planner, current, behind, short


def test_a_merged_worker_just_short_on_a_busy_machine_does_not_split_it_again() -> None:
    """test_target_sizing on Apache Kafka at load ~12: 60 ev/s on four workers (concurrency 2, about 200 ev/s
    each) merged to one, and the planner split again on "62 ev/s in, 59 ev/s per worker": the merged
    worker counted as falling behind (here: 59 handled of 62, events 1.5 s old, 60 % busy), so its
    handled rate became the capacity. Inside the rate the merge was sized for, the merged size is
    short only when it stays behind for the stabilization window."""
    planner, current, behind, short = just_short_after_a_merge()
    for now in range(11, 26):
        d = planner.decide(current, behind, now=now, load=short)
        assert d.next_map is None, d.reason
    # behind from the merge's settle time (16) for the whole stabilization window: short on its measured rate
    d = planner.decide(current, behind, now=26, load=short)
    assert d.action == "split", d.reason


def test_a_merged_worker_whose_estimate_dips_is_not_split_again() -> None:
    """`keyrange demo` in its quiet phase at load ~20: four workers measured 383 ev/s each and merged to
    one at 114 ev/s; 19 s later (past the cooldown) the merged worker handled 125 ev/s, 250 records (0.6 s)
    behind, measured 78 % busy, and the planner split to 3 on "131 ev/s in, 250 records behind, 160 ev/s
    per worker": a dip of the estimate, not a shortfall of the rate."""
    limits = ScalingLimits(min_workers=1, max_workers=4, lag_high_seconds=3.0, lag_low_records=200,
                           cooldown_seconds=10.0)
    planner = Planner(limits)
    current = RangeMap.even(4, 4)
    measured = {s: SlotLag() for s in range(4)}
    quiet = Load({s: 114 / 4 for s in range(4)}, {w: WorkerLoad(28.5, permits_busy=28.5 / 383) for w in range(4)})
    planner.decide(current, measured, now=0, load=quiet)
    down = planner.decide(current, measured, now=10, load=quiet)
    assert down.next_map is not None and down.next_map.workers == 1
    current = down.next_map
    dip = Load({s: 131 / 4 for s in range(4)}, {0: WorkerLoad(125, permits_busy=0.31, cpu_busy=0.78)})
    for now in range(11, 60):
        d = planner.decide(current, {s: SlotLag(62, 0.6) for s in range(4)}, now=now, load=dip)
        assert d.next_map is None, d.reason
    assert "rate fits" in d.reason


def test_a_merged_worker_must_fall_behind_for_the_window_on_end() -> None:
    planner, current, behind, short = just_short_after_a_merge()
    for now in range(11, 21):
        assert planner.decide(current, behind, now=now, load=short).next_map is None
    # one window in which it keeps up (capacity is fine) starts the count again
    planner.decide(current, CAUGHT_UP, now=21, load=Load({s: 5.0 for s in range(12)}, {0: WorkerLoad(60, 0.3)}))
    for now in range(22, 32):
        d = planner.decide(current, behind, now=now, load=short)
        assert d.next_map is None, d.reason
    assert planner.decide(current, behind, now=32, load=short).action == "split"
