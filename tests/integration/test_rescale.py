"""Rescaling under load with the real engine: guarantees hold through many splits and merges.

Workers run in this process (one event loop, real `keyrange.worker.Worker` engines, a real
broker: tansu and Apache Kafka) so the test can stretch every release: each old owner waits 0.4 s before draining,
which makes every handoff pause long enough to show that slots which did not move kept flowing.

`make test` runs at least RESCALES = 8 rescales, one full cycle 1 -> 5 -> 1 workers (every size
split to and merged from), more while the stream lasts; `make soak` runs the same test with at
least 22 (`KEYRANGE_RESCALES=22`), which on a busy machine takes minutes per broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Collection, Mapping
from typing import Any

import pytest

from keyrange.handlers import load_handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase, produce_phases
from keyrange.ranges.channel import ControlChannel
from keyrange.ranges.controller import Controller, Rescale
from keyrange.ranges.membership import run_controlled
from keyrange.ranges.planner import ScalingLimits, SlotLag
from keyrange.worker import Worker, WorkerSettings
from tests.checkers import LoggedEvent, check_all
from tests.kafkatools import log_ends, offsets_committed_so_far, read_counts, read_input_log, read_processed
from tests.stacks import describe_stuck_handoff

PARTITIONS = 12
RELEASE_DELAY_SECONDS = 0.4
STREAM_SECONDS = 30
"""The shortest stream the rescales run under."""
RESCALES = int(os.environ.get("KEYRANGE_RESCALES", "8"))
"""Rescales done before the stream may stop: `make test` 8 (1 -> 5 -> 1 workers), `make soak` 22."""
UNMOVED_CHECKS_PER_RESCALE = 60 / 22
"""At least this many unmoved slots' flows are checked per rescale (60 for 22)."""
STREAM_AFTER_SECONDS = 2.0
"""The stream goes on this long after the RESCALES-th rescale."""
STREAM_CAP_SECONDS = RESCALES * 11.25
"""The stream stops by then in any case (90 s for `make test`); the rescales still missing run
after it, and the flow check's floor (UNMOVED_CHECKS_PER_RESCALE) still needs most of them inside
it. A longer stream only means more records to read back and check within the test's timeout."""
FINISH_TIMEOUT_SECONDS = 60.0
"""How long the workers get, after the stream, to finish what the last rescales left them."""

progress = logging.getLogger("tests.rescale")


@pytest.fixture
def bootstrap(any_bootstrap: str) -> str:
    """Every test of this module runs on tansu and on Apache Kafka (tests/conftest.py's `broker_engine`)."""
    return any_bootstrap


class SlowReleaseWorker(Worker):
    """The real engine, with a deliberately slow release (as if in-flight work took long)."""

    async def release(self, slots: Collection[int], commit: bool = True) -> None:  # type: ignore[override]
        if set(slots) & self.held_slots:
            await asyncio.sleep(RELEASE_DELAY_SECONDS)
        await super().release(slots, commit)


class NoLag:
    def slot_lag(self) -> Mapping[int, SlotLag]:
        return {}


class Fleet:
    def __init__(self) -> None:
        self.workers = 0

    def scale_to(self, workers: int) -> None:
        self.workers = workers


def moved_slot_resumes(processed: list[Mapping[str, Any]], rescales: list[Rescale]) -> dict[tuple[int, int], int]:
    """(epoch, slot) -> when the slot's new owner started its first event (the first start after
    the grant: the old owner stopped before it)."""
    by_slot: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for r in processed:
        by_slot[r["partition"]].append((r["startedAt"], r["worker"]))
    for values in by_slot.values():
        values.sort()
    out = {}
    for r in rescales:
        assert r.settled_ms is not None
        for slot in r.moved_slots:
            later = [t for t, _ in by_slot[slot] if t >= r.settled_ms]
            if later:
                out[(r.epoch, slot)] = later[0]
    return out


def unmoved_slots_kept_flowing(processed: list[Mapping[str, Any]], rescales: list[Rescale],
                               stream_ms: tuple[int, int]) -> tuple[int, list[str]]:
    """For each handoff while the stream ran, every slot that did not move (and was not still
    resuming from an earlier move) must have handled an event while the moved slots were paused
    (between the epoch's publication and the grant). Returns (slots checked, failures)."""
    starts: dict[int, list[int]] = defaultdict(list)
    created: dict[int, list[int]] = defaultdict(list)
    for r in processed:
        starts[r["partition"]].append(r["startedAt"])
        created[r["partition"]].append(r["created"])
    resumes = moved_slot_resumes(processed, rescales)
    first_start = {slot: min(times) for slot, times in starts.items()}
    dark: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in rescales:
        for slot in r.moved_slots:
            dark[slot].append((r.published_ms, resumes.get((r.epoch, slot), stream_ms[1])))
    checked, failures = 0, []
    for r in rescales:
        assert r.settled_ms is not None
        lo, hi = r.published_ms, r.settled_ms
        if not stream_ms[0] < lo < hi < stream_ms[1] - 1000:
            continue  # no input arrived then: nothing could flow
        if hi - lo < RELEASE_DELAY_SECONDS * 1000 * 0.9:
            continue  # the old owner had not acquired the slots yet: nothing paused
        for slot in set(range(PARTITIONS)) - r.moved_slots:
            if any(a < hi and b > lo for a, b in dark[slot]):
                continue  # still resuming from an earlier move
            if first_start.get(slot, hi) >= hi:
                continue  # its first owner's first acquire was still restoring (the window's length only guesses that)
            checked += 1
            if not any(lo < t < hi for t in starts[slot]):
                # What it could have handled: its events created before the window's end, and when it
                # started the next one (a stall of the slot, or of the load's producer).
                waiting = sum(1 for c, t in zip(created[slot], starts[slot], strict=True) if c < hi and t >= hi)
                later = min((t for t in starts[slot] if t >= hi), default=None)
                failures.append(f"epoch {r.epoch}: unmoved slot {slot} handled nothing during {lo}..{hi} "
                                f"({hi - lo} ms; {waiting} of its events created before its end started after it, "
                                f"the first at +{None if later is None else later - hi} ms)")
    return checked, failures


def wait_finished(bootstrap: str, topic: str, group: str, log: Collection[LoggedEvent],
                  timeout_seconds: float = FINISH_TIMEOUT_SECONDS) -> None:
    """Return once the group's committed offsets cover every event of `log`; fail after the timeout
    naming the partitions whose committed offset stopped short (a stalled slot, not a slow check)."""
    ends = log_ends(log)
    began = time.monotonic()
    committed: dict[int, int] = {}
    while time.monotonic() - began < timeout_seconds:
        committed = offsets_committed_so_far(bootstrap, topic, group, ends)
        if all(committed.get(p, -1) >= end for p, end in ends.items()):
            progress.info("every event finished %.1f s after the stream", time.monotonic() - began)
            return
        time.sleep(0.2)
    short = {p: f"{committed.get(p)} of {end}" for p, end in sorted(ends.items()) if committed.get(p, -1) < end}
    raise AssertionError(f"{timeout_seconds:.0f} s after the stream the group's committed offsets still stop short "
                         f"of the log's end (partition: committed of end): {short}")


@pytest.mark.slow
async def test_rescales_under_ledger_load_keep_every_guarantee(bootstrap: str, topic_name: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # The members' and engines' INFO lines (releasing, acquiring, released in ... ms) show on a failure.
    caplog.set_level(logging.INFO, logger="keyrange")
    caplog.set_level(logging.INFO, logger=progress.name)  # where the test's time went, on a timeout too
    topic, group = topic_name, f"{topic_name}-g"
    await asyncio.to_thread(ensure_topics, bootstrap, [TopicSpec(topic, PARTITIONS)])
    await asyncio.to_thread(ControlChannel.ensure_topic, bootstrap, group)
    limits = ScalingLimits(min_workers=1, max_workers=5, lag_high_records=10**9, lag_low_records=0,
                           cooldown_seconds=0)
    fleet = Fleet()
    controller = Controller(ControlChannel(bootstrap, group, "controller"), PARTITIONS, limits, NoLag(), fleet)
    await asyncio.to_thread(controller.start)
    # Even workers run the ledger inline (at dispatch), odd ones with a delay (async, through the
    # client queues): slots move between the two paths in both directions, with the same results.
    handlers = [load_handler("ledger"), load_handler("ledger", {"delayMs": 1})]
    assert [h.inline for h in handlers] == [True, False]
    running: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}

    def start(ordinal: int) -> None:
        settings = WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=group, worker_id=str(ordinal),
                                  concurrency=32, commit_interval_ms=50)
        stop = asyncio.Event()
        engine = SlowReleaseWorker(settings, handlers[ordinal % 2])
        running[ordinal] = (asyncio.create_task(run_controlled(engine, bootstrap, group, ordinal, stop,
                                                               heartbeat_seconds=0.5)), stop)

    async def reconcile(done: asyncio.Event) -> None:
        while not done.is_set():
            for o in range(fleet.workers):
                if o not in running:
                    start(o)
            for o in [o for o in running if o >= fleet.workers]:
                task, stop = running.pop(o)
                stop.set()
                await task
            await asyncio.sleep(0.05)

    # Ledger commands (+5% duplicates) at 2,000/s for at least STREAM_SECONDS (60,000 commands), and on
    # until RESCALES rescales were done while it flowed: a slow machine rescales less often.
    load_stop = threading.Event()
    shape = LoadShape(rate=2000, clients=300, duplicate_ratio=0.05, ledger=True, seed=11)
    load = asyncio.create_task(asyncio.to_thread(produce_phases, bootstrap, topic, shape,
                                                 [Phase(STREAM_CAP_SECONDS, 2000)], load_stop))
    stream_began, stop_scheduled = time.monotonic(), False
    done = asyncio.Event()
    reconciler = asyncio.create_task(reconcile(done))
    try:
        up = True
        while not load.done() or len(controller.rescales) < RESCALES:
            workers = controller.publication.map.workers
            up = True if workers <= 1 else False if workers >= limits.max_workers else up
            result = await asyncio.to_thread(controller.request_scale, "up" if up else "down", "test")
            assert result.applied, result.detail
            requested = time.monotonic()
            for _ in range(1200):
                pub = await asyncio.to_thread(controller.step)
                if not pub.transit and not controller.status().starting:
                    break
                await asyncio.sleep(0.05)
            assert not controller.publication.transit, describe_stuck_handoff(controller)
            progress.info("rescale %d (to %d workers) took %.1f s, %.0f s into the stream%s", len(controller.rescales),
                          controller.publication.map.workers, time.monotonic() - requested,
                          time.monotonic() - stream_began, " (ended)" if load.done() else "")
            if (not stop_scheduled and len(controller.rescales) >= RESCALES
                    and time.monotonic() - stream_began >= STREAM_SECONDS):
                # A little more stream: rescales settling in its last second are not checked.
                asyncio.get_running_loop().call_later(STREAM_AFTER_SECONDS, load_stop.set)
                stop_scheduled = True
            await asyncio.sleep(0.3)
        totals = await load
        progress.info("%d records sent in %.0f s", totals.sent, time.monotonic() - stream_began)
        # Stopping a worker does not drain it: the last rescale's new owners may still be acquiring
        # and working off their backlog on a loaded machine. A slot nobody finishes still fails below.
        log = await asyncio.to_thread(read_input_log, bootstrap, topic, totals.sent)
        await asyncio.to_thread(wait_finished, bootstrap, topic, group, log)
    finally:
        load_stop.set()
        done.set()
        await reconciler
        for task, stop in list(running.values()):
            stop.set()
            await task
        controller.channel.close()
    rescales = controller.rescales
    assert len(rescales) >= RESCALES
    assert {r.action for r in rescales} == {"split", "merge"}
    assert len(log) == totals.sent >= 50_000
    distinct = len({e.uuid for e in log})
    processed = await asyncio.to_thread(read_processed, bootstrap, f"{topic}.processed", distinct)
    progress.info("read back %d input and %d processed records", len(log), len(processed))
    check_all(log, list(processed), read_counts(bootstrap, topic, group, covering=len(log)), ledger=True)
    assert len(processed) == distinct
    stream = (min(e.body["created"] for e in log), max(e.body["created"] for e in log))
    checked, failures = unmoved_slots_kept_flowing(list(processed), rescales, stream)
    assert not failures, failures[:5]
    # Fewer when a slow broker leaves more rescales after the stream, which nothing flows through.
    assert checked >= RESCALES * UNMOVED_CHECKS_PER_RESCALE, \
        f"only {checked} unmoved slots were checked: too few rescales ran while the stream did"
    resumes = moved_slot_resumes(list(processed), rescales)
    pauses = sorted(resume - r.published_ms for r in rescales for slot in r.moved_slots
                    if (resume := resumes.get((r.epoch, slot))))
    print(f"{len(rescales)} rescales, {checked} unmoved slots checked; moved-slot pause: "
          f"p50 {pauses[len(pauses) // 2]} ms, max {pauses[-1]} ms over {len(pauses)} moves")


def test_the_flow_check_skips_a_slot_before_its_first_acquire_ended_but_not_a_slot_that_stalled() -> None:
    """The check itself (no broker): a first acquire slower than the first split (a starved machine)
    is not a stall of an unmoved slot; a slot that had flowed and then stopped still is."""
    split = Rescale("split", "test", epoch=2, workers_before=1, workers_after=2, moved_slots=frozenset(range(6, 12)),
                    decided_ms=1_000, published_ms=1_000, settled_ms=3_450)

    def record(slot: int, started: int) -> dict[str, Any]:
        return {"partition": slot, "startedAt": started, "created": started - 10, "worker": "0"}

    flowing = [record(slot, t) for slot in range(5) for t in (500, 2_000, 3_600)]
    first_acquire_late = [*flowing, record(5, 3_517)]
    assert unmoved_slots_kept_flowing(first_acquire_late, [split], (0, 10_000)) == (5, [])
    stalled = [*flowing, record(5, 500), record(5, 3_517)]
    checked, failures = unmoved_slots_kept_flowing(stalled, [split], (0, 10_000))
    assert checked == 6 and len(failures) == 1 and "unmoved slot 5 handled nothing" in failures[0]
