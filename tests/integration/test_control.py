"""The assignment protocol on the real broker, with in-memory engines standing in for workers.

Checks the handoff's safety property directly: at no moment do two workers hold the same slot,
through many forced splits and merges, with members that crash mid-handoff and restart.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
from collections.abc import Collection, Mapping, Set

import pytest

from keyrange.ranges.channel import ControlChannel, WorkerReport, now_ms
from keyrange.ranges.controller import Controller
from keyrange.ranges.member import RangeMember
from keyrange.ranges.planner import ScalingLimits, SlotLag
from tests.stacks import describe_members

SLOTS = 12


class Holdings:
    """Who holds which slot, asserting exclusivity on every acquire."""

    def __init__(self) -> None:
        self.holder: dict[int, int] = {}
        self.violations: list[str] = []
        self.acquisitions = 0
        self.prefetched: list[tuple[int, frozenset[int]]] = []

    def acquire(self, worker: int, slots: Collection[int]) -> None:
        for s in slots:
            other = self.holder.get(s)
            if other is not None and other != worker:
                self.violations.append(f"w{worker} acquired slot {s} still held by w{other}")
            self.holder[s] = worker
            self.acquisitions += 1

    def release(self, worker: int, slots: Collection[int]) -> None:
        for s in slots:
            if self.holder.get(s) == worker:
                del self.holder[s]

    def crash(self, worker: int) -> None:
        self.release(worker, [s for s, w in self.holder.items() if w == worker])


class FakeEngine:
    """Acquire/release with a little simulated work (restore, drain) in between."""

    def __init__(self, worker: int, holdings: Holdings, rng: random.Random) -> None:
        self.worker, self.holdings, self.rng = worker, holdings, rng
        self._held: set[int] = set()

    @property
    def held_slots(self) -> Set[int]:
        return self._held

    async def acquire(self, slots: Collection[int]) -> None:
        await asyncio.sleep(self.rng.uniform(0, 0.03))
        self.holdings.acquire(self.worker, slots)
        self._held |= set(slots)

    async def release(self, slots: Collection[int]) -> None:
        await asyncio.sleep(self.rng.uniform(0, 0.03))
        self._held -= set(slots)
        self.holdings.release(self.worker, slots)

    async def prefetch(self, slots: Collection[int]) -> bool:
        await asyncio.sleep(self.rng.uniform(0, 0.1))
        self.holdings.prefetched.append((self.worker, frozenset(slots)))
        return True

    def use_slot_count(self, slot_count: int) -> None:
        """The fake holds slot numbers whatever they are."""

    def committed_positions(self) -> dict[int, int]:
        return {}


class NoLag:
    def slot_lag(self) -> Mapping[int, SlotLag]:
        return {}


class DesiredCount:
    def __init__(self) -> None:
        self.workers = 0

    def scale_to(self, workers: int) -> None:
        self.workers = workers


async def test_forced_rescales_never_let_two_workers_hold_a_slot(bootstrap: str, topic_name: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="keyrange.ranges")  # a failure shows each handoff's timeline
    group = topic_name
    ControlChannel.ensure_topic(bootstrap, group)
    holdings, rng, fleet = Holdings(), random.Random(7), DesiredCount()
    limits = ScalingLimits(min_workers=1, max_workers=5, lag_high_records=10**9, lag_low_records=0,
                           cooldown_seconds=0)
    controller = Controller(ControlChannel(bootstrap, group, "controller"), SLOTS, limits, NoLag(), fleet)
    await asyncio.to_thread(controller.start)
    stop_all = asyncio.Event()
    members: dict[int, tuple[asyncio.Task[None], asyncio.Event, ControlChannel]] = {}
    crashes = 0

    def start_member(w: int) -> None:
        channel = ControlChannel(bootstrap, group, f"w{w}")
        stop = asyncio.Event()
        member = RangeMember(FakeEngine(w, holdings, rng), channel, w, heartbeat_seconds=0.5, poll_seconds=0.02)
        members[w] = (asyncio.create_task(member.run(stop)), stop, channel)

    async def stop_member(w: int, crash: bool) -> None:
        task, stop, channel = members.pop(w)
        if crash:
            task.cancel()
            holdings.crash(w)  # a dead process holds nothing; its transaction is aborted
        else:
            stop.set()
        await asyncio.gather(task, return_exceptions=True)
        channel.close()

    async def reconcile() -> None:
        while not stop_all.is_set():
            for w in range(fleet.workers):
                if w not in members:
                    start_member(w)
            for w in [w for w in members if w >= fleet.workers]:
                await stop_member(w, crash=False)
            await asyncio.sleep(0.02)

    reconciler = asyncio.create_task(reconcile())
    try:
        direction_up = True
        for i in range(24):
            if controller.publication.map.workers >= limits.max_workers:
                direction_up = False
            elif controller.publication.map.workers <= 1:
                direction_up = True
            result = await asyncio.to_thread(controller.request_scale, "up" if direction_up else "down", f"test {i}")
            assert result.applied, result.detail
            crash_now = i % 6 == 3
            for _ in range(1000):
                pub = await asyncio.to_thread(controller.step)
                if crash_now and pub.transit:
                    # Crash an old owner in the middle of the handoff; it restarts and catches up.
                    await asyncio.sleep(rng.uniform(0, 0.05))
                    await stop_member(min(pub.awaiting), crash=True)
                    crashes += 1
                    crash_now = False
                if not pub.transit and not controller.status().starting:
                    break
                await asyncio.sleep(0.02)
            assert not controller.publication.transit, f"handoff {i} did not complete: {controller.status()}"
        final = controller.publication.map
        for _ in range(500):
            if all(holdings.holder.get(s) == final.owner_of(s) for s in range(SLOTS)):
                break
            await asyncio.sleep(0.02)
    finally:
        stop_all.set()
        await reconciler
        for w in list(members):
            await stop_member(w, crash=False)
        controller.channel.close()
    assert not holdings.violations, holdings.violations[:5]
    assert crashes == 4
    assert len(controller.rescales) == 24
    assert {r.action for r in controller.rescales} == {"split", "merge"}
    assert all(r.settled_ms is not None for r in controller.rescales)
    # Every handoff waited for its new owner to read the moved slots ahead.
    assert len(holdings.prefetched) >= 24
    assert "did not read ahead" not in caplog.text
    assert {s: holdings.holder.get(s) for s in range(SLOTS)} == {s: final.owner_of(s) for s in range(SLOTS)}


def test_controller_resumes_from_the_newest_epoch(bootstrap: str, topic_name: str) -> None:
    ControlChannel.ensure_topic(bootstrap, topic_name)
    limits = ScalingLimits(max_workers=4, cooldown_seconds=0)
    first = Controller(ControlChannel(bootstrap, topic_name, "c1"), SLOTS, limits, NoLag())
    pub = first.start()
    assert pub.map.describe() == "epoch 1: w0=0-11"
    assert first.request_scale("down", "test").detail == "already at workers.min=1"
    first.start_timeout_seconds = 0  # nobody runs w1: publish the split without waiting for it
    first.warm_timeout_seconds = 0  # ... or for it to read ahead
    assert first.request_scale("up", "test").applied
    # epoch 2 has slots in transit; w0 never reports, so the handoff stays pending
    assert first.request_scale("up", "again").detail.startswith("a rescale is in progress")
    first.channel.close()
    second = Controller(ControlChannel(bootstrap, topic_name, "c2"), SLOTS, limits, NoLag())
    resumed = second.start()
    assert resumed.epoch == 2 and resumed.transit and resumed.awaiting == {0}
    second.channel.close()
    stop = threading.Event()
    stop.set()
    second.run(stop)  # returns at once when stopped


def test_poll_returns_when_a_record_arrives_not_at_its_timeout(bootstrap: str, topic_name: str) -> None:
    """Handoff latency rests on this: a reader waiting on the topic sees a record at once."""
    ControlChannel.ensure_topic(bootstrap, topic_name)
    reader = ControlChannel(bootstrap, topic_name, "reader")
    writer = ControlChannel(bootstrap, topic_name, "writer")
    try:
        reader.catch_up()
        timer = threading.Timer(0.3, writer.report, args=(WorkerReport(3, 1, frozenset({1}), now_ms(), 1),))
        timer.start()
        began = time.monotonic()
        assert reader.poll(30.0) == 1
        timer.join()
        assert time.monotonic() - began < 15, "poll waited for its timeout instead of the record"
        assert reader.state.reports[3].held == {1}
    finally:
        reader.close()
        writer.close()


class IdleWaitWatch(threading.Event):
    """The controller's wake event, telling when the run loop first waits on it: only its idle
    wait does, so from then on the loop is in that wait (60 s here) unless woken."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        return super().wait(timeout)


async def test_a_requested_rescale_is_followed_at_once_not_at_the_next_idle_step(bootstrap: str,
                                                                                 topic_name: str) -> None:
    """request_scale (the alert webhook's path) wakes the run loop, which then follows the handoff
    record by record: with an idle interval of 60 s the handoff still completes in seconds."""
    group = topic_name
    ControlChannel.ensure_topic(bootstrap, group)
    holdings, rng = Holdings(), random.Random(3)
    limits = ScalingLimits(min_workers=1, max_workers=2, cooldown_seconds=0)
    controller = Controller(ControlChannel(bootstrap, group, "controller"), SLOTS, limits, NoLag())
    await asyncio.to_thread(controller.start)
    controller.start_timeout_seconds = 0  # w1's member runs, but the split need not wait for its report
    stop_controller = threading.Event()
    runner = threading.Thread(target=controller.run, args=(stop_controller, 60.0), daemon=True)
    members = [(ControlChannel(bootstrap, group, f"w{w}"), asyncio.Event()) for w in range(2)]
    tasks = [asyncio.create_task(RangeMember(FakeEngine(w, holdings, rng), channel, w, poll_seconds=0.02).run(stop))
             for w, (channel, stop) in enumerate(members)]
    try:
        while holdings.holder.get(0) != 0:
            await asyncio.sleep(0.02)
        idle = IdleWaitWatch()
        controller._wake = idle
        runner.start()
        assert await asyncio.to_thread(idle.entered.wait, 30), "the run loop never went idle"
        began = time.monotonic()
        assert (await asyncio.to_thread(controller.request_scale, "up", "test")).applied
        while controller.publication.transit or controller.publication.epoch < 3:
            assert time.monotonic() - began < 30, f"handoff not followed: {controller.status()}"
            await asyncio.sleep(0.02)
    finally:
        stop_controller.set()
        for _, stop in members:
            stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(runner.join, 10)
        for channel, _ in members:
            channel.close()
        controller.channel.close()
    assert not runner.is_alive(), "the run loop did not stop within its idle wait"
    assert controller.publication.map.workers == 2


class SlowPrefetch(FakeEngine):
    """Reads ahead for `seconds`: long enough that a handoff publishing without waiting for it shows."""

    def __init__(self, worker: int, holdings: Holdings, rng: random.Random, seconds: float) -> None:
        super().__init__(worker, holdings, rng)
        self.seconds = seconds

    async def prefetch(self, slots: Collection[int]) -> bool:
        await asyncio.sleep(self.seconds)
        self.holdings.prefetched.append((self.worker, frozenset(slots)))
        return True


async def test_a_split_whose_new_worker_starts_late_still_waits_for_its_read_ahead(
        bootstrap: str, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The read-ahead wait (warm_timeout_seconds) counts from when the split's new worker runs, not
    from the decision: a pod that takes longer than it to start (scheduling, an image pull) must
    still get its read-ahead before the moved slots change hands."""
    group = topic_name
    ControlChannel.ensure_topic(bootstrap, group)
    holdings, rng = Holdings(), random.Random(5)
    limits = ScalingLimits(min_workers=1, max_workers=2, cooldown_seconds=0)
    controller = Controller(ControlChannel(bootstrap, group, "controller"), SLOTS, limits, NoLag(),
                            warm_timeout_seconds=3.0)
    await asyncio.to_thread(controller.start)
    stop_controller = threading.Event()
    runner = threading.Thread(target=controller.run, args=(stop_controller,), daemon=True)
    members: list[tuple[ControlChannel, asyncio.Event, asyncio.Task[None]]] = []

    def start_member(engine: FakeEngine) -> None:
        channel, stop = ControlChannel(bootstrap, group, f"w{engine.worker}"), asyncio.Event()
        task = asyncio.create_task(RangeMember(engine, channel, engine.worker, poll_seconds=0.02).run(stop))
        members.append((channel, stop, task))

    try:
        start_member(FakeEngine(0, holdings, rng))
        while holdings.holder.get(0) != 0:
            await asyncio.sleep(0.02)
        runner.start()
        assert (await asyncio.to_thread(controller.request_scale, "up", "test")).applied
        await asyncio.sleep(4.0)  # the new worker starts after the read-ahead wait has passed since the decision
        assert controller.publication.epoch == 1, "published before the new worker ran"
        start_member(SlowPrefetch(1, holdings, rng, seconds=1.0))
        began = time.monotonic()
        while controller.publication.transit or controller.publication.epoch < 3:
            assert time.monotonic() - began < 30, f"handoff not followed: {controller.status()}"
            await asyncio.sleep(0.02)
    finally:
        stop_controller.set()
        for _, stop, _ in members:
            stop.set()
        await asyncio.gather(*(task for _, _, task in members), return_exceptions=True)
        await asyncio.to_thread(runner.join, 10)
        for channel, _, _ in members:
            channel.close()
        controller.channel.close()
    assert [w for w, _ in holdings.prefetched] == [1]
    assert "did not read ahead" not in caplog.text


def test_a_members_description_says_which_epoch_it_applied_and_how_far_it_read(bootstrap: str,
                                                                               topic_name: str) -> None:
    # What a stuck handoff's failure message shows of each worker (tests/stacks.describe_members).
    ControlChannel.ensure_topic(bootstrap, topic_name)
    channel = ControlChannel(bootstrap, topic_name, "w3")
    member = RangeMember(FakeEngine(3, Holdings(), random.Random(0)), channel, 3)
    try:
        channel.report(WorkerReport(3, 0, frozenset(), now_ms(), 1))
        channel.catch_up()
        # The end is the broker's ListOffsets answer, which tansu can give too low right after a write.
        assert re.fullmatch(r"w3: applied epoch 0, read epoch None, control read to 1 of \d+", describe_members())
    finally:
        channel.close()
    del member
