"""The TTL dedup set with an injected clock."""

from __future__ import annotations

import pytest

from keyrange.worker.dedup import BUCKETS_PER_TTL, TtlSet


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_uuid_is_new_once_within_the_ttl() -> None:
    clock = FakeClock()
    seen = TtlSet(10.0, clock)
    assert seen.add_if_new("a")
    assert not seen.add_if_new("a")
    clock.now += 9.9
    assert not seen.add_if_new("a")
    assert seen.add_if_new("b")


def test_entries_expire_after_the_ttl_never_before() -> None:
    clock = FakeClock()
    seen = TtlSet(10.0, clock)
    seen.add_if_new("a")
    clock.now += 10.0 - 1e-6
    seen.expire()
    assert "a" in seen
    clock.now += 10.0 / BUCKETS_PER_TTL + 1e-3  # past the TTL plus one bucket of granularity
    assert seen.add_if_new("a")


def test_memory_is_bounded_by_rate_times_ttl() -> None:
    clock = FakeClock()
    seen = TtlSet(10.0, clock)
    for i in range(100_000):  # 1000/s for 100 s
        clock.now += 0.001
        seen.add_if_new(f"u{i}")
    assert 10_000 <= len(seen) <= 10_000 * (1 + 1 / BUCKETS_PER_TTL) + 1


def test_rebuilt_entries_keep_their_age() -> None:
    clock = FakeClock()
    seen = TtlSet(10.0, clock)
    seen.add_seen_at("old", clock.now - 11.0)  # already expired: not added
    seen.add_seen_at("recent", clock.now - 9.0)
    assert "old" not in seen and "recent" in seen
    clock.now += 1.5
    seen.expire()
    assert "recent" not in seen


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl_seconds must be positive"):
        TtlSet(0, FakeClock())
