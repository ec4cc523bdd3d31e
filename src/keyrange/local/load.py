"""A paced load in phases (steady, burst, quiet) for `keyrange run --produce` and the demo.

It reuses the kata's generator (`keyrange.loadgen.generate`): same clients, uuid4 ids,
duplicates 10 ms to 5 s later, ledger commands; only the rate changes from phase to phase.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from keyrange.loadgen import LoadShape, generate, make_producer


@dataclass(frozen=True)
class Phase:
    """Produce at `rate` events/s for `seconds`."""

    seconds: float
    rate: float


@dataclass
class LoadTotals:
    """What was sent so far (read while the load runs)."""

    sent: int = 0
    duplicates: int = 0
    phase: int = 0
    phase_started_ms: list[int] = field(default_factory=list)
    """When each phase began (epoch ms), in order."""


def produce_phases(bootstrap: str, topic: str, shape: LoadShape, phases: Sequence[Phase],
                   stop: threading.Event, totals: LoadTotals | None = None,
                   client_properties: Mapping[str, str] | None = None) -> LoadTotals:
    """Send the phases one after the other, paced in real time, until done or `stop` is set.
    The topic must exist (the supervisor creates it with the spec's partition count)."""
    totals = totals or LoadTotals()
    producer = make_producer(bootstrap, client_properties)
    try:
        for index, phase in enumerate(phases):
            totals.phase = index
            totals.phase_started_ms.append(int(time.time() * 1000))
            seed = None if shape.seed is None else shape.seed + index
            records = generate(dataclasses.replace(shape, rate=phase.rate, seed=seed), duration_s=phase.seconds)
            start = time.monotonic()
            for record in records:
                delay = start + record.due_s - time.monotonic()
                if delay > 0:
                    producer.poll(0)
                    if stop.wait(delay):
                        return totals
                while True:
                    try:
                        # Record timestamp = created (wire contract).
                        producer.produce(topic, record.value, record.key, timestamp=record.created_ms)
                        break
                    except BufferError:
                        producer.poll(0.05)
                totals.sent += 1
                totals.duplicates += record.duplicate
            if stop.is_set():
                return totals
    finally:
        producer.flush(30)
    return totals
