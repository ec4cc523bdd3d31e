"""A restore's parsing on its thread leaves the worker's event loop its rounds (worker/pacing.py)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from keyrange.worker.pacing import Pacer
from keyrange.worker.restore import ParsedLogs, restore_with
from keyrange.worker.settings import WorkerSettings
from tests.logmodel import FakeMessage, ModelReader, input_record

SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="events", group_id="g", worker_id="w0")
T0_MS = 1_800_000_000_000
INPUT = (SETTINGS.topic, 0)
EVENTS = 40_000
"""Input records in the window a restore reads (about what a read-ahead of a few busy slots parses)."""


class FakeClock:
    """A clock that moves on by `step` at every look."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_pacer_steps_aside_once_per_slice_of_running_time() -> None:
    naps: list[float] = []
    pacer = Pacer(slice_seconds=0.001, step_aside_seconds=0.0001, clock=FakeClock(0.0002), sleep=naps.append)
    assert list(pacer.paced(range(32 * 20))) == list(range(32 * 20))
    # 20 looks at the clock 0.2 ms apart (and one after each nap): a nap every ~1 ms of them.
    assert naps and len(naps) <= 20 // 5 + 1 and set(naps) == {0.0001}


def test_parsing_a_restore_steps_aside_as_it_goes() -> None:
    naps: list[float] = []
    logs = ParsedLogs(pacer=Pacer(slice_seconds=0.001, clock=FakeClock(0.0002), sleep=naps.append))
    records = [input_record(o, f"u{o}", T0_MS + o, T0_MS + o) for o in range(3200)]
    logs.add(SETTINGS, INPUT, [FakeMessage(INPUT, r) for r in records])
    assert len(logs.inputs[0]) == 3200
    assert len(naps) >= 3200 // 32 // 6


def test_the_event_loop_keeps_its_rounds_while_a_restore_parses_beside_it() -> None:
    # EVENTS records within the window before the committed offset: all of them parsed.
    records = [input_record(o, f"u{o}", T0_MS + o // 10, T0_MS + o // 10) for o in range(EVENTS)]
    reader = ModelReader({INPUT: records, (SETTINGS.sink, 0): [], (SETTINGS.dlq, 0): [], (SETTINGS.state, 0): []})
    counts = {SETTINGS.topic: 1, SETTINGS.sink: 1, SETTINGS.dlq: 1, SETTINGS.state: 1}
    now_s = (T0_MS + EVENTS // 10 + 1000) / 1000

    async def rounds_during_restore() -> tuple[int, float]:
        # A round as the worker's loop makes them: a call on another thread (a fetch), then back.
        other = ThreadPoolExecutor(1)
        loop = asyncio.get_running_loop()
        restoring = loop.run_in_executor(None, restore_with, reader, SETTINGS, {0: EVENTS}, counts, now_s)
        rounds, began = 0, time.perf_counter()
        while not restoring.done():
            await loop.run_in_executor(other, time.sleep, 0)
            rounds += 1
        took = time.perf_counter() - began
        restored = await restoring
        assert len(restored[0].seen) == EVENTS
        other.shutdown()
        return rounds, took

    rounds, took = asyncio.run(rounds_during_restore())
    # A round per 800 records parsed at least: unpaced, the loop got the interpreter back about once
    # per switch interval (5 ms), a round per 1,600-2,100 records here; paced, one per 180-350.
    assert rounds >= EVENTS // 800, f"{rounds} rounds in {took:.3f} s beside a restore of {EVENTS} records"
