"""FetchStalls (stalls.py): which held partitions' fetch stalled, with an injected clock."""

from __future__ import annotations

from keyrange.worker.stalls import LONGEST_STALL_SECONDS, STALL_SECONDS, FetchStalls, PartitionFetch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stuck(reading: int = 100, log_end: int = 150, position: int | None = None) -> PartitionFetch:
    return PartitionFetch(reading, reading if position is None else position, log_end, idle=True)


def test_an_idle_partition_behind_its_log_end_stalls_after_the_wait_and_again_after_twice_it() -> None:
    clock = Clock()
    stalls = FetchStalls(clock)
    assert stalls.observe({0: stuck()}) == []
    clock.now += STALL_SECONDS - 0.1
    assert stalls.observe({0: stuck()}) == []
    clock.now += 0.1
    [first] = stalls.observe({0: stuck()})
    assert (first.partition, first.offset, first.log_end, first.refetches) == (0, 100, 150, 0)
    assert first.seconds == STALL_SECONDS
    assert "partition 0 fetched nothing past offset 100 for 20 s though its log ends at 150" in first.describe()
    clock.now += 2 * STALL_SECONDS - 0.1
    assert stalls.observe({0: stuck()}) == []
    clock.now += 0.1
    [second] = stalls.observe({0: stuck()})
    assert second.refetches == 1 and second.seconds == 3 * STALL_SECONDS
    assert "1 refetches at this offset did not help" in second.describe()


def test_the_wait_between_refetches_stops_doubling_at_the_longest() -> None:
    clock = Clock()
    stalls = FetchStalls(clock)
    stalls.observe({0: stuck()})
    waits = []
    last = clock.now
    while len(waits) < 12:
        clock.now += 1
        if stalls.observe({0: stuck()}):
            waits.append(clock.now - last)
            last = clock.now
    assert waits[:3] == [STALL_SECONDS, 2 * STALL_SECONDS, 4 * STALL_SECONDS]
    assert max(waits) == LONGEST_STALL_SECONDS and waits[-1] == LONGEST_STALL_SECONDS


def test_a_partition_that_reads_on_starts_its_wait_over() -> None:
    clock = Clock()
    stalls = FetchStalls(clock)
    stalls.observe({0: stuck(100)})
    for reading in range(101, 140):
        clock.now += 1
        assert stalls.observe({0: stuck(reading)}) == []
    clock.now += STALL_SECONDS
    assert [s.offset for s in stalls.observe({0: stuck(139)})] == [139]


def test_pending_paused_or_released_work_is_not_a_stall() -> None:
    clock = Clock()
    stalls = FetchStalls(clock)
    busy = PartitionFetch(100, 100, 150, idle=False)
    for _ in range(100):
        assert stalls.observe({0: busy}) == []
        clock.now += 1
    # Idle again: its wait starts now, not when it was first seen.
    assert stalls.observe({0: stuck()}) == []
    clock.now += STALL_SECONDS - 1
    assert stalls.observe({0: stuck()}) == []


def test_caught_up_or_an_unknown_end_or_only_commit_markers_left_is_not_a_stall() -> None:
    clock = Clock()
    stalls = FetchStalls(clock)
    for _ in range(100):
        observed = {0: stuck(150, 150), 1: stuck(100, -1),
                    2: stuck(100, 101, position=101)}  # a transactional input's last commit marker
        assert stalls.observe(observed) == []
        clock.now += 1


def test_a_partition_no_longer_held_is_forgotten() -> None:
    clock = Clock()
    stalls = FetchStalls(clock)
    stalls.observe({0: stuck()})
    clock.now += STALL_SECONDS
    stalls.observe({})
    assert stalls.observe({0: stuck()}) == []  # held again: a fresh wait
    clock.now += STALL_SECONDS
    assert len(stalls.observe({0: stuck()})) == 1


def test_partitions_are_watched_apart() -> None:
    clock = Clock()
    stalls = FetchStalls(clock, stall_seconds=5)
    stalls.observe({0: stuck(), 1: stuck()})
    clock.now += 5
    assert [s.partition for s in stalls.observe({0: stuck(), 1: stuck(101)})] == [0]
