"""Guarantee checkers shared by every test that runs events through keyrange.

Each takes the input log as produced (in per-partition offset order) and the processed records
as consumed from the sink, and raises AssertionError with a readable sample of what broke. Like
Decaton's PROCESS_ORDERING and AT_LEAST_ONCE_DELIVERY, one checker per guarantee in docs/design.md.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoggedEvent:
    """An input record as it sits in the log: where, and what."""

    partition: int
    offset: int
    client_id: int | str
    """As the input mapping finds it: an integer by default, text (a record key, say) otherwise."""
    uuid: str
    body: Mapping[str, Any]


def first_occurrences(log: Iterable[LoggedEvent]) -> list[LoggedEvent]:
    """The input log with every repeated uuid after its first occurrence removed, in log order
    per partition (a duplicate is dropped, the original is handled)."""
    seen: set[str] = set()
    out = []
    for e in sorted(log, key=lambda e: (e.partition, e.offset)):
        if e.uuid not in seen:
            seen.add(e.uuid)
            out.append(e)
    return out


def check_no_loss(log: Iterable[LoggedEvent], processed: Iterable[Mapping[str, Any]],
                  dead_lettered: Iterable[str] = ()) -> None:
    """Every distinct input uuid was handled (has a processed record) or was dead-lettered."""
    expected = {e.uuid for e in log}
    handled = {r["uuid"] for r in processed} | set(dead_lettered)
    missing = expected - handled
    assert not missing, f"{len(missing)} of {len(expected)} events were lost, e.g. {sorted(missing)[:5]}"
    unknown = handled - expected
    assert not unknown, f"{len(unknown)} processed uuids are not in the input, e.g. {sorted(unknown)[:5]}"


def check_no_duplicates(processed: Iterable[Mapping[str, Any]]) -> None:
    """No uuid was handled twice (each has exactly one processed record)."""
    counts = Counter(r["uuid"] for r in processed)
    twice = {u: n for u, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} uuids were handled more than once, e.g. {list(twice.items())[:5]}"


def check_order_per_client(log: Iterable[LoggedEvent], processed: Iterable[Mapping[str, Any]]) -> None:
    """Per client: handler calls never overlapped and ran in input-log order.

    Taken in the log order of each uuid's first occurrence, every call must start no earlier
    than the previous call of that client finished (startedAt/finishedAt, epoch ms).
    """
    position = {e.uuid: (e.partition, e.offset) for e in first_occurrences(log)}
    by_client: dict[int | str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in processed:
        if r["uuid"] in position:  # one that is not in the input is check_no_loss's to report
            by_client[r["clientId"]].append(r)
    for client, records in by_client.items():
        in_log_order = sorted(records, key=lambda r: position[r["uuid"]])
        for a, b in itertools.pairwise(in_log_order):
            assert b["startedAt"] >= a["finishedAt"], (
                f"client {client!r}: {b['uuid']} (log position {position[b['uuid']]}) started at "
                f"{b['startedAt']}, before {a['uuid']} (log position {position[a['uuid']]}) finished at "
                f"{a['finishedAt']}: calls overlapped or ran out of log order"
            )


def ledger_oracle(log: Iterable[LoggedEvent]) -> dict[str, dict[str, int]]:
    """The result each ledger command must have, computed sequentially from the input log."""
    counters: dict[int | str, int] = defaultdict(int)
    results: dict[str, dict[str, int]] = {}
    for e in first_occurrences(log):
        op = e.body.get("op")
        if op == "increment":
            counters[e.client_id] += int(e.body["amount"])
            returned = counters[e.client_id]
        elif op == "drain":
            returned = counters[e.client_id]
            counters[e.client_id] = 0
        else:
            continue
        results[e.uuid] = {"value": counters[e.client_id], "returned": returned}
    return results


def check_ledger(log: Iterable[LoggedEvent], processed: Iterable[Mapping[str, Any]]) -> None:
    """Every ledger result equals the sequential oracle's (order-sensitive by construction)."""
    expected = ledger_oracle(log)
    wrong = [r for r in processed if r["uuid"] in expected and r["result"] != expected[r["uuid"]]]
    # The first wrong result of a client says which worker ran it from a stale state, and when.
    first: dict[Any, Mapping[str, Any]] = {}
    for r in sorted(wrong, key=lambda r: (r.get("partition", 0), r.get("offset", 0))):
        first.setdefault(r["clientId"], r)
    where = [(r["clientId"], r["uuid"], r["result"], expected[r["uuid"]], f"{r.get('partition')}@{r.get('offset')}",
              r.get("worker"), r.get("startedAt")) for r in list(first.values())[:5]]
    assert not wrong, (f"{len(wrong)} ledger results differ from the sequential oracle, in {len(first)} client(s); "
                       f"each one's first (client, uuid, got, expected, partition@offset, worker, startedAt): {where}")


@dataclass(frozen=True)
class Counts:
    """How the workers say the input finished (their committed totals or their counters)."""

    handled: int
    dead_lettered: int
    duplicates_dropped: int


def check_counts(log: Iterable[LoggedEvent], counts: Counts) -> None:
    """Exact accounting: events handled + dead-lettered = unique input events, and duplicates
    dropped = input records - unique uuids (every duplicate in these tests is within the TTL)."""
    records = list(log)
    unique = len({e.uuid for e in records})
    assert counts.handled + counts.dead_lettered == unique, (
        f"{counts.handled:,} handled + {counts.dead_lettered:,} dead-lettered != {unique:,} unique input events"
    )
    assert counts.duplicates_dropped == len(records) - unique, (
        f"{counts.duplicates_dropped:,} duplicates dropped, but the input holds {len(records) - unique:,} "
        f"({len(records):,} records, {unique:,} unique uuids)"
    )


def check_all(log: list[LoggedEvent], processed: list[Mapping[str, Any]], counts: Counts | None,
              dead_lettered: Iterable[str] = (), ledger: bool = False) -> None:
    """Run every guarantee checker that applies, and fail with what each one that failed says (a
    loss reads differently with the counts beside it: handled without an output, or dropped as a
    duplicate). `counts` is required on purpose: a test that cannot know the workers' counts says so
    by passing None."""
    checks: list[Callable[[], None]] = [
        lambda: check_no_duplicates(processed),
        lambda: check_no_loss(log, processed, dead_lettered),
        lambda: check_order_per_client(log, processed),
    ]
    if ledger:
        checks.append(lambda: check_ledger(log, processed))
    if counts is not None:
        checks.append(lambda: check_counts(log, counts))
    failures = []
    for check in checks:
        try:
            check()
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)
