"""The dedup window: uuids within a TTL of the partition's stream time (event time)."""

from __future__ import annotations

import pytest

from keyrange.worker.dedup import BUCKETS_PER_TTL, TtlSet

WALL = 10_000.0


def wall() -> float:
    return WALL


def test_a_uuid_is_new_once_within_the_ttl() -> None:
    seen = TtlSet(10.0, wall)
    assert seen.add_if_new("a", 1000.0)
    assert not seen.add_if_new("a", 1000.0)  # a duplicate repeats its original's event time
    assert seen.add_if_new("b", 1009.9)
    assert not seen.add_if_new("a", 1000.0)


def test_entries_expire_when_stream_time_moves_past_the_ttl_never_before() -> None:
    seen = TtlSet(10.0, wall)
    seen.add_if_new("a", 1000.0)
    seen.add_if_new("x", 1010.0 - 1e-6)
    assert "a" in seen
    seen.add_if_new("y", 1010.0 + 10.0 / BUCKETS_PER_TTL + 1e-3)  # past the TTL plus one bucket
    assert "a" not in seen and "x" in seen
    # Sent again after the TTL: handled again, and remembered from when it arrived, so a third
    # copy right after it is a duplicate of the second.
    assert seen.add_if_new("a", 1000.0)
    assert not seen.add_if_new("a", 1000.0)


def test_dedup_does_not_depend_on_how_late_events_are_handled() -> None:
    """A stalled partition (events handled long after they were sent) drops the same duplicates."""
    prompt = TtlSet(10.0, lambda: 1010.0)  # handled as it arrives
    stalled = TtlSet(10.0, lambda: 1100.0)  # handled 90 s later
    stream = [("e1", 1000.0), ("e2", 1003.0), ("e1", 1000.0), ("e3", 1008.0), ("e2", 1003.0)]
    handled_promptly = [prompt.add_if_new(k, t) for k, t in stream]
    handled_late = [stalled.add_if_new(k, t) for k, t in stream]
    assert handled_promptly == handled_late == [True, True, False, True, False]


def test_memory_is_bounded_by_rate_times_ttl() -> None:
    seen = TtlSet(10.0, wall)
    for i in range(100_000):  # 1000/s for 100 s of event time
        seen.add_if_new(f"u{i}", i / 1000)
    assert 10_000 <= len(seen) <= 10_000 * (1 + 1 / BUCKETS_PER_TTL) + 1


def test_a_producer_clock_in_the_future_cannot_flush_the_window() -> None:
    seen = TtlSet(10.0, wall)
    seen.add_if_new("a", WALL - 1)
    seen.add_if_new("skewed", WALL + 3600)  # an hour ahead: stream time stops at the wall clock
    assert seen.stream_time == WALL
    assert "a" in seen


def test_expiring_a_window_that_saw_nothing_yet_is_a_no_op() -> None:
    seen = TtlSet(10.0, wall)
    seen.expire()  # the worker's gauge loop does this every second, also on idle partitions
    assert len(seen) == 0 and seen.add_if_new("a", 1.0)


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl_seconds must be positive"):
        TtlSet(0, wall)


def test_one_event_from_the_future_does_not_stop_the_window_from_expiring() -> None:
    now = [1000.0]
    seen = TtlSet(10.0, lambda: now[0])
    seen.add_if_new("far-future", 1000.0 + 10**9)  # a clock decades ahead
    for i in range(100_000):  # 100 events/s for 1,000 s, each handled as it arrives
        now[0] = 1000.0 + i / 100
        seen.add_if_new(f"u{i}", now[0])
    assert len(seen) <= 100 * 10 * (1 + 1 / BUCKETS_PER_TTL) + 1
    assert seen.stream_time == now[0]


def test_a_producer_whose_clock_is_behind_still_gets_its_duplicates_dropped() -> None:
    seen = TtlSet(10.0, wall)
    seen.add_if_new("on-time", WALL)
    late = WALL - 3600  # an hour behind the partition's stream time
    assert seen.add_if_new("late", late)
    assert not seen.add_if_new("late", late)  # its duplicate, right after: within the TTL
    assert "late" in seen


def test_events_less_than_a_bucket_apart_cannot_walk_the_clock_past_the_wall_clock() -> None:
    now = [1000.0]
    seen = TtlSet(10.0, lambda: now[0])
    for i in range(2000):  # a burst from a producer running ahead: each 0.19 s (< one bucket) after the last
        seen.add_if_new(f"burst{i}", 1000.0 + i * 0.19)
    assert seen.stream_time <= now[0]
    assert seen.add_if_new("x", now[0])
    for i in range(3000):  # then 30 s of 100 events/s, on time
        now[0] = 1000.0 + i / 100
        seen.add_if_new(f"u{i}", now[0])
    # Sent again 30 s (3 x the TTL) after the original: handled again, and the burst has expired.
    assert seen.add_if_new("x", now[0])
    assert len(seen) <= 100 * 10 * (1 + 1 / BUCKETS_PER_TTL) + 2


def test_a_replayed_event_from_the_future_does_not_move_the_clock() -> None:
    # A restore replays the log without the wall clock each event was seen at: an event stamped
    # past the clock now was past its owner's then, and its owner saw it at the stream time or later.
    seen = TtlSet(10.0, wall)
    seen.replay("a", WALL - 60)
    seen.replay("ahead", WALL + 3600)
    assert seen.stream_time == WALL - 60
    assert "ahead" in seen
    seen.replay("b", WALL - 59)
    assert seen.stream_time == WALL - 59 and "a" in seen


def test_a_replay_that_starts_from_the_future_starts_the_clock_at_the_wall_clock() -> None:
    seen = TtlSet(10.0, wall)
    seen.replay("ahead", WALL + 3600)
    assert seen.stream_time == WALL and "ahead" in seen


def test_a_dropped_copy_renews_its_uuid_so_any_copy_within_the_ttl_of_another_is_dropped() -> None:
    seen = TtlSet(10.0, wall)
    assert seen.add_if_new("a", 1000.0)
    assert not seen.add_if_new("a", 1008.0)  # a copy 8 s later: dropped, and "a" renewed at 1008
    seen.add_if_new("x", 1015.0)  # 15 s past the first copy, 7 s past the second
    assert not seen.add_if_new("a", 1015.0)  # within the TTL of the second copy
    seen.add_if_new("y", 1025.5)  # more than a TTL and a bucket past the last copy
    assert "a" not in seen
    assert seen.add_if_new("a", 1025.5)
    assert "x" not in seen and len(seen) == 2  # a (new again) and y: x expired, and a's earlier entries
