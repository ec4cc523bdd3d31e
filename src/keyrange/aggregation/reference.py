"""The same aggregates in plain Python: the oracle the Spark job is tested against, and the
baseline its throughput is benchmarked against. Single process, everything in memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

MINUTE_MS = 60_000
"""Window length: one minute of the events' `created` time."""
PERCENTILES = (0.5, 0.95, 0.99)
"""Percentiles reported per window (columns `*_p50_ms`, `*_p95_ms`, `*_p99_ms`)."""
REQUIRED = ("clientId", "uuid", "created", "startedAt", "finishedAt")


@dataclass(frozen=True)
class Delivery:
    """One record as read from the sink topic: where it sits and its raw value."""

    partition: int
    offset: int
    value: bytes


def percentile(values: Sequence[float], q: float) -> float:
    """Exact percentile with linear interpolation between closest ranks (Spark's `percentile`)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


_LONG = (-(2**63), 2**63 - 1)


def _text(client_id: Any) -> str:
    """A clientId as the job groups it: text as is, anything else as its JSON (an integer's decimal)."""
    return client_id if isinstance(client_id, str) else orjson.dumps(client_id).decode()


def _ledger_value(result: Any) -> int | None:
    """`result.value` if it is a JSON integer that fits the table's 64-bit column (not a float, a
    string or a boolean, which Python would count as an int), else None."""
    if isinstance(result, dict):
        value = result.get("value")
        if type(value) is int and _LONG[0] <= value <= _LONG[1]:
            return value
    return None


def aggregate(deliveries: Iterable[Delivery]) -> dict[str, list[dict[str, Any]]]:
    """clients, windows and workers rows (same columns as the Parquet tables), deduplicated by
    uuid keeping the first delivery in (sink partition, offset) order."""
    seen: set[str] = set()
    clients: dict[str, dict[str, Any]] = {}
    workers: dict[str | None, dict[str, Any]] = {}
    latencies: dict[int, list[float]] = {}
    handler_times: dict[int, list[float]] = {}
    for d in sorted(deliveries, key=lambda d: (d.partition, d.offset)):
        try:
            r = orjson.loads(d.value)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(r, dict) or any(r.get(k) is None for k in REQUIRED) or r["uuid"] in seen:
            continue
        seen.add(r["uuid"])
        client_id = _text(r["clientId"])
        c = clients.setdefault(client_id, {
            "client_id": client_id, "events": 0, "first_seen_ms": r["created"],
            "last_seen_ms": r["created"], "ledger_value": None, "last_partition": None, "last_offset": None,
        })
        c["events"] += 1
        c["first_seen_ms"] = min(c["first_seen_ms"], r["created"])
        c["last_seen_ms"] = max(c["last_seen_ms"], r["created"])
        position = (r.get("partition"), r.get("offset"))
        if c["last_offset"] is None or position > (c["last_partition"], c["last_offset"]):
            c["last_partition"], c["last_offset"] = position
            c["ledger_value"] = _ledger_value(r.get("result"))
        handler = r["finishedAt"] - r["startedAt"]
        w = workers.setdefault(r.get("worker"), {
            "worker": r.get("worker"), "events": 0, "handler_ms_total": 0,
            "first_finished_ms": r["finishedAt"], "last_finished_ms": r["finishedAt"],
        })
        w["events"] += 1
        w["handler_ms_total"] += handler
        w["first_finished_ms"] = min(w["first_finished_ms"], r["finishedAt"])
        w["last_finished_ms"] = max(w["last_finished_ms"], r["finishedAt"])
        minute = r["created"] - r["created"] % MINUTE_MS
        latencies.setdefault(minute, []).append(float(r["startedAt"] - r["created"]))
        handler_times.setdefault(minute, []).append(float(handler))
    for w in workers.values():
        w["handler_ms_mean"] = w["handler_ms_total"] / w["events"]
    windows = []
    for minute in sorted(latencies):
        row: dict[str, Any] = {"window_start_ms": minute, "window_end_ms": minute + MINUTE_MS,
                               "events": len(latencies[minute])}
        for q in PERCENTILES:
            row[f"latency_p{round(q * 100)}_ms"] = percentile(latencies[minute], q)
            row[f"handler_p{round(q * 100)}_ms"] = percentile(handler_times[minute], q)
        windows.append(row)
    return {
        "clients": sorted(clients.values(), key=lambda c: c["client_id"]),
        "windows": windows,
        "workers": sorted(workers.values(), key=lambda w: str(w["worker"])),
    }
