"""How a consumer group's input finished, counted exactly once per offset, read back from Kafka.

Every transaction that moves a partition's committed offset (and the few that write or name a
changelog snapshot: snapshots.py) also writes a totals record to the group's changelog (key
`keyrange.totals`): how many offsets below the new committed offset were
handled, dead-lettered and dropped as duplicates. A new owner restores the totals with the rest
of the partition (restore.py) and counts on from there, so the totals survive handoffs, crashes
and restarts, which per-process Prometheus counters do not (a SIGKILLed worker's counts since its
last scrape are gone). `keyrange run` reports them when it stops; tests check them against the
input log. Like a restore, reading them reads the changelog from the newest snapshot the committed
offset vouches for (snapshots.py), not from its start.
"""

from __future__ import annotations

from collections.abc import Iterable

from keyrange.ranges.layout import SlotLayout
from keyrange.worker.commitwindow import Totals
from keyrange.worker.logreader import LogReader
from keyrange.worker.positions import slot_starts
from keyrange.worker.restore import ParsedLogs
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.snapshots import changelog_starts, slot_totals_key


def committed_totals(settings: WorkerSettings, partitions: Iterable[int],
                     layout: SlotLayout | None = None) -> dict[int, Totals]:
    """Per input partition, the totals its slots' committed offsets cover, summed over the slots
    (zeros when nothing committed). `layout`: how the partitions are cut into slots (default: one
    slot per partition; the control topic's range map says: the control topic's range map)."""
    parts = sorted(set(partitions))
    reader = LogReader(settings)
    try:
        layout = layout or SlotLayout.whole_partitions(parts)
        slots = [s for p in parts for s in layout.slots_of_partition(p)]
        committed = slot_starts(reader, settings.topic, settings.state, slots, layout)
        parsed = ParsedLogs()
        reader.read(changelog_starts(reader, settings.state, committed, layout),
                    each=lambda span, messages: parsed.add(settings, span, messages))
    finally:
        reader.close()
    out = {}
    for p in parts:
        total = Totals()
        for s in layout.slots_of_partition(p):
            key = slot_totals_key(layout, s)
            # The newest record counting up to at most the committed offset (a newer one belongs to a
            # transaction whose offsets did not commit: see restore.fold_logs).
            covered = [e.totals for e in parsed.totals.get(p, []) if e.key == key and e.counted_to <= committed[s]]
            if covered:
                total = total.plus([covered[-1].handled, covered[-1].dead_lettered, covered[-1].duplicates_dropped])
        out[p] = total
    return out


def sum_totals(per_partition: Iterable[Totals]) -> Totals:
    """The totals of several partitions together."""
    out = Totals()
    for t in per_partition:
        out = out.plus([t.handled, t.dead_lettered, t.duplicates_dropped])
    return out
