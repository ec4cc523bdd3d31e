"""Snapshots of a partition's keyed state in its changelog: what bounds a restore's read.

The changelog (`<group>.state`) gets a record per changed client per transaction and a totals
record per offset commit, for as long as the consumer runs; Kafka compacts only closed segments
and tansu never compacts. So a restore does not read it from its start: it reads from the newest
snapshot the committed offset can vouch for.

- **Writing.** Once the changelog holds `SNAPSHOT_EVERY` times (live clients + `SNAPSHOT_FLOOR`)
  records since the last snapshot, the slot's next transaction writes a snapshot: every live
  client's state (with the input offset of the event that set it), then the totals record. The
  offset of its first record comes back in its delivery report; once that transaction committed,
  every later totals record names it (header `keyrange.snapshot`), and the next transaction writes
  one even if the committed offset did not move. A snapshot is named only after its transaction
  committed, so a torn (tansu) or aborted one is never named; read from an older snapshot, the
  records of a torn one are changelog records like the others (restore.py's rules hold for them).
- **Reading (`changelog_starts`).** The newest totals record counting up to at most the committed
  offset C names the snapshot to read from: found by reading the changelog partition backwards
  from its end, in steps that double, so the read is bounded by what was written since that
  record. The restore then reads from the snapshot's start (restore.py folds it as any stretch of
  the changelog). A record without the header (or no totals record at all) means: from the start.

Why reading from a snapshot gives the state a read from the start gives (restore.py's rules:
entries with source offset < C folded in log order, then the states of the processed records
>= C): a snapshot entry supersedes every earlier entry of its client. A snapshot entry at or past
C is ignored like any such entry; its event finished before the snapshot's transaction, which
committed, so its processed record (>= C) is there and carries that state, as the state the full
read ends with. A client without a snapshot entry had no state then, and every later entry of it
is read. The totals the restore needs are within the read: the record naming the snapshot and
every newer one follow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Message

from keyrange.events import SNAPSHOT_HEADER, SOURCE_OFFSET_HEADER, is_totals_key, totals_key
from keyrange.kafkaquirks import WHOLE_LOG_FROM
from keyrange.logend import Span
from keyrange.ranges.layout import SlotLayout
from keyrange.worker.logreader import LogReader

SNAPSHOT_EVERY = 4
"""A snapshot is due once the changelog records since the last one reach this many times the
live clients plus SNAPSHOT_FLOOR: a restore reads about that many records (plus the snapshot),
and snapshots add at most 1/SNAPSHOT_EVERY to what the changelog is written."""
SNAPSHOT_FLOOR = 1000
"""Added to the live clients in the rule above, so that few clients do not mean a snapshot every
few commits."""
CHANGELOG_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": str(60 * 60 * 1000)}
"""Configs `<group>.state` is created with. Kafka compacts only closed segments, and by default a
segment closes after 7 days: an hour lets compaction drop what snapshots superseded. Restores do
not depend on it (tansu never compacts)."""
SEARCH_FIRST_RECORDS = 1000
"""Records the search for the newest totals record reads first (back from the end of the log);
each further step back reads twice as many."""


class SnapshotSchedule:
    """When a slot writes the next snapshot, and which one its totals records name (pure)."""

    __slots__ = ("named", "since", "start")

    def __init__(self, start: int | None, since: int) -> None:
        self.start = start
        """Changelog offset of the newest committed snapshot (None: none known; read from the start)."""
        self.since = since
        """Changelog records written after it, as far as this owner knows."""
        self.named = True
        """A committed totals record names `start` (otherwise the next transaction writes one)."""

    def due(self, live_clients: int) -> bool:
        """Whether the next transaction writes a snapshot of the `live_clients` clients' states."""
        return self.since >= SNAPSHOT_EVERY * (live_clients + SNAPSHOT_FLOOR)

    def committed(self, records: int, snapshot_at: int | None, wrote_snapshot: bool, named: int | None) -> None:
        """A transaction committed `records` changelog records; with `wrote_snapshot`, a snapshot
        whose first record has offset `snapshot_at` (None: its delivery report did not tell; then
        the old snapshot stays named, and the next one is due as late as if this one counted).
        `named`: the snapshot start its totals record carried (None: it wrote none)."""
        if named is not None and named == self.start:
            self.named = True
        if wrote_snapshot:
            self.since = 0
            if snapshot_at is not None:
                self.start, self.named = snapshot_at, False
        self.since += records


def snapshot_named(m: Message) -> tuple[int, int | None] | None:
    """(the offset a totals record counts up to, the snapshot start it names or None), or None
    for any other changelog record."""
    if not is_totals_key(m.key()):
        return None
    headers = dict(m.headers() or [])
    counted_to = headers.get(SOURCE_OFFSET_HEADER)
    if not isinstance(counted_to, bytes):
        return None
    start = headers.get(SNAPSHOT_HEADER)
    return int(counted_to), (int(start) if isinstance(start, bytes) else None)


@dataclass(frozen=True, slots=True)
class TotalsQuery:
    """Which totals record a restore looks for in one changelog partition."""

    partition: int
    key: bytes
    """The slot's totals key (events.totals_key)."""
    bound: int | None
    """Only records counting up to at most this offset (the committed one); None: the newest."""


def changelog_starts(reader: LogReader, state_topic: str, committed: Mapping[int, int],
                     layout: SlotLayout | None = None) -> dict[Span, int]:
    """Per changelog partition of the slots in `committed` (slot -> committed offset C): where a
    restore reads it from: the oldest of the snapshots named by each slot's newest totals record
    counting up to at most its C, or the log's start when one names none.

    A read to the end afterwards on the same reader ends where this search's first step ended
    (logend.py), which is enough: every record a restore from C uses was written before C committed."""
    layout = layout or SlotLayout.whole_partitions(committed)
    queries = {slot: TotalsQuery(layout.partition_of(slot), slot_totals_key(layout, slot), c)
               for slot, c in committed.items()}
    newest = newest_totals(reader, state_topic, queries)
    found: dict[Span, int] = {}
    for slot, query in queries.items():
        span = (state_topic, query.partition)
        record = newest[slot]
        start = WHOLE_LOG_FROM if record is None or record[1] is None else record[1]
        found[span] = min(found.get(span, start), start)
    return found


def slot_totals_key(layout: SlotLayout, slot: int) -> bytes:
    """The changelog key of `slot`'s totals records."""
    return totals_key(slot % layout.per_partition, layout.per_partition)


def newest_totals(reader: LogReader, state_topic: str,
                  queries: Mapping[int, TotalsQuery]) -> dict[int, tuple[int, int | None] | None]:
    """Per query: (counted_to, snapshot start or None) of the newest totals record that answers it,
    or None when the changelog partition holds none.

    Found by reading each partition backwards from its end, in steps that double, so the read is
    bounded by what was written since that record. The first step reads to the end of the log, the
    later ones up to where the previous began."""
    spans = {(state_topic, q.partition) for q in queries.values()}
    bounds = reader.bounds(spans)
    answers: dict[int, tuple[int, int | None]] = {}
    asked: dict[Span, list[tuple[int, TotalsQuery]]] = {}
    for qid, q in queries.items():
        asked.setdefault((state_topic, q.partition), []).append((qid, q))
    upper: dict[Span, int] = {}
    """Where the next step's read stops (absent: the first step, read to the end)."""
    step_found: dict[int, tuple[int, int | None]] = {}

    def look(span: Span, messages: list[Message]) -> None:
        for m in messages:  # in log order: the last one that answers a query is the newest in this step
            named = snapshot_named(m)
            if named is None:
                continue
            key = m.key()
            for qid, q in asked[span]:
                if qid not in answers and key == q.key and (q.bound is None or named[0] <= q.bound):
                    step_found[qid] = named

    step = SEARCH_FIRST_RECORDS
    pending = set(spans)
    while pending:
        starts = {span: max(bounds[span][0], upper.get(span, bounds[span][1]) - step) for span in pending}
        step_found.clear()
        reader.read(starts, {span: upper[span] for span in pending if span in upper}, each=look)
        answers.update(step_found)
        for span in list(pending):
            if starts[span] <= bounds[span][0] or all(qid in answers for qid, _ in asked[span]):
                pending.discard(span)
            else:
                upper[span] = starts[span]
        step *= 2
    return {qid: answers.get(qid) for qid in queries}
