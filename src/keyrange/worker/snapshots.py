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

from confluent_kafka import Message

from keyrange.events import SNAPSHOT_HEADER, SOURCE_OFFSET_HEADER, TOTALS_KEY
from keyrange.logend import Span
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
    if m.key() != TOTALS_KEY:
        return None
    headers = dict(m.headers() or [])
    counted_to = headers.get(SOURCE_OFFSET_HEADER)
    if not isinstance(counted_to, bytes):
        return None
    start = headers.get(SNAPSHOT_HEADER)
    return int(counted_to), (int(start) if isinstance(start, bytes) else None)


def changelog_starts(reader: LogReader, state_topic: str, committed: Mapping[int, int]) -> dict[Span, int]:
    """Per changelog partition of `committed` (partition -> committed offset C): where a restore
    reads it from: the snapshot named by the newest totals record counting up to at most C, or
    the log's start when none names one.

    The first step reads to the end of the log, the later ones up to where the previous began.
    A read to the end afterwards on the same reader ends where this one ended (logend.py), which
    is enough: every record a restore from C uses was written before C committed."""
    spans = {(state_topic, p): c for p, c in committed.items()}
    bounds = reader.bounds(spans)
    found: dict[Span, int] = {}
    upper: dict[Span, int] = {}
    """Where the next step's read stops (absent: the first step, read to the end)."""
    newest: dict[Span, int | None] = {}
    """The snapshot start named by the newest totals record counting up to C found so far."""

    def look(span: Span, messages: list[Message]) -> None:
        for m in messages:  # in log order: the last one counting up to C is the newest
            named = snapshot_named(m)
            if named is not None and named[0] <= spans[span]:
                newest[span] = named[1]

    step = SEARCH_FIRST_RECORDS
    pending = dict(spans)
    while pending:
        starts = {span: max(bounds[span][0], upper.get(span, bounds[span][1]) - step) for span in pending}
        reader.read(starts, {span: upper[span] for span in pending if span in upper}, each=look)
        for span in list(pending):
            if span in newest or starts[span] <= bounds[span][0]:
                start = newest.get(span)
                found[span] = bounds[span][0] if start is None else start
                del pending[span]
            else:
                upper[span] = starts[span]
        step *= 2
    return found
