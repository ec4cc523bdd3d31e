"""A restore beside the event loop: how many rounds a worker's event loop makes while a restore
parses on its thread, with the parsing paced (worker/pacing.py) and without.

No broker: `ParsedLogs.add` parses RECORDS input events (the default format) in batches of 5,000,
as a restore's reader hands them over, on a thread of its own; meanwhile the event loop makes
rounds as it does between fetches: a call on another thread, then back on the loop. Per mode: the
loop's rounds per second while the parse runs (and alone, before it), and the parse's records per
second. Unpaced is the same code with a slice that never runs out.

    python -m benchmarks --only restore_pacing [--quick]
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.harness import load_average, row
from keyrange.events import encode_input
from keyrange.worker.pacing import Pacer
from keyrange.worker.restore import ParsedLogs
from keyrange.worker.settings import WorkerSettings

SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="events", group_id="g", worker_id="w0")
BATCH = 5_000
"""Records per batch, as LogReader.READ_BATCH hands them over."""
ALONE_SECONDS = 1.0


class Record:
    """The part of confluent_kafka.Message that parsing an input record reads."""

    def __init__(self, offset: int, key: bytes, value: bytes, timestamp_ms: int) -> None:
        self._offset, self._key, self._value, self._ts = offset, key, value, timestamp_ms

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, self._ts


def records(count: int) -> list[Record]:
    """`count` input events of 100 clients, a millisecond apart."""
    out = []
    for offset in range(count):
        created = 1_800_000_000_000 + offset
        key, value = encode_input(offset % 100, f"u{offset}", created)
        out.append(Record(offset, key, value, created))
    return out


def parse(logs: ParsedLogs, batch: list[list[Record]]) -> None:
    """Parse the batches as a restore's reader hands them over."""
    for messages in batch:
        logs.add(SETTINGS, (SETTINGS.topic, 0), messages)  # type: ignore[arg-type]


async def rounds(until: Any, seconds: float | None = None) -> tuple[int, float]:
    """The loop's rounds until `until` is done (or for `seconds`), and how long that took."""
    other = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    began, count = time.perf_counter(), 0
    while (until is None or not until.done()) and (seconds is None or time.perf_counter() - began < seconds):
        await loop.run_in_executor(other, time.sleep, 0)
        count += 1
    other.shutdown()
    return count, time.perf_counter() - began


async def measure(count: int, paced: bool) -> tuple[float, float, float]:
    """(loop rounds/s alone, loop rounds/s beside the parse, parsed records/s)."""
    made = records(count)
    batches = [made[i:i + BATCH] for i in range(0, count, BATCH)]
    alone, alone_s = await rounds(None, ALONE_SECONDS)
    logs = ParsedLogs(pacer=Pacer() if paced else Pacer(slice_seconds=math.inf))
    loop = asyncio.get_running_loop()
    began = time.perf_counter()
    parsing = loop.run_in_executor(None, parse, logs, batches)
    beside, _ = await rounds(parsing)
    await parsing
    took = time.perf_counter() - began
    assert len(logs.inputs[0]) == count
    return alone / alone_s, beside / took, count / took


def run(quick: bool) -> list[dict[str, Any]]:
    """Per mode: the loop's rounds/s beside the parse (against alone) and the parse's records/s."""
    count = 50_000 if quick else 200_000
    out = []
    for paced in (False, True):
        mode = "paced" if paced else "unpaced"
        alone, beside, parsed = asyncio.run(measure(count, paced))
        notes = f"{count} records; {load_average()}"
        out += [
            row(f"restore parse, {mode}: event-loop rounds/s beside it", beside, "rounds/s", baseline=alone,
                notes=f"baseline: the loop alone; {notes}"),
            row(f"restore parse, {mode}: records parsed/s", parsed, "records/s", notes=notes),
        ]
    return out
