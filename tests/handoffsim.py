"""A model of hash-range slots writing one partition's logs as the worker does, for restore tests.

Each slot of the partition handles its own clients' ledger events (one client's calls in log order,
clients finishing out of order), and commits them in transactions of its own, appended to the shared
sink and changelog partitions between its siblings' transactions: processed records carrying the
client's state after the event, one changelog record per changed client (the offset of its last
event), now and then a snapshot of every client's state, and last the totals record that counts up
to the slot's lowest unfinished offset and names the newest committed snapshot. A slot's last
owner may be killed mid-transaction, which tansu commits torn: a prefix of its sink records and of
its changelog records, the totals record only when every output is there (it is written after they
were acknowledged); its successor resumes from what a restore of the logs gives. With `late_writes`,
an owner is frozen instead, and the changelog records its torn transaction had in flight land after
some of its successor's transactions (tansu). `expected_state` is what a restore of a slot must give.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from keyrange.events import (
    GROUP_HEADER,
    SNAPSHOT_HEADER,
    SOURCE_OFFSET_HEADER,
    STATE_HEADER,
    encode_input,
    encode_totals,
    json_bytes,
    totals_key,
)
from keyrange.ranges.layout import SlotLayout
from keyrange.worker.positions import slot_starts
from keyrange.worker.restore import RestoredPartition, restore_with
from keyrange.worker.settings import WorkerSettings
from tests.logmodel import ModelReader, Record

SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="in", group_id="g")
COUNTS = {SETTINGS.topic: 1, SETTINGS.sink: 1, SETTINGS.dlq: 1, SETTINGS.state: 1}
NOW_S = 1_000.0
"""Far past every record's time: the restore's time-based reads start at the logs' beginnings."""


@dataclass
class SlotWriter:
    """One hash-range slot's owner: what it finished and committed."""

    slot: int
    offsets: list[int]
    """Its events' input offsets, ascending."""
    finished: list[int] = field(default_factory=list)
    """In the order they finished (each client's in log order)."""
    committed_upto: int = 0
    """How many of `finished` its transactions carried."""
    state: dict[int, int] = field(default_factory=dict)
    state_offsets: dict[int, int] = field(default_factory=dict)
    snapshot_start: int | None = None
    since_snapshot: int = 0
    after: dict[int, int] = field(default_factory=dict)
    """Input offset -> its client's state after the event."""
    relog: dict[int, int] = field(default_factory=dict)
    """Clients whose restored state came from processed records, with their offsets: changelogged again."""


@dataclass
class HandoffLogs:
    """The logs of one input partition cut into hash-range slots (module docstring)."""

    layout: SlotLayout
    events: list[tuple[int, str, int]]
    """(client, op, amount) per input offset."""
    logs: dict[tuple[str, int], list[Record]]
    processed: set[int] = field(default_factory=set)
    """The input offsets of the events with a visible processed record."""

    def slot_of(self, client: int) -> int:
        """The slot `client`'s records go to."""
        return self.layout.slot_for_key(0, str(client).encode())

    def expected_state(self, slot: int, committed: int) -> dict[int, int]:
        """The state a restore of `slot` from `committed` must give: every event below it, and every
        one at or past it with a visible processed record, applied in log order."""
        state: dict[int, int] = {}
        for offset, (client, op, amount) in enumerate(self.events):
            if self.slot_of(client) != slot or not (offset < committed or offset in self.processed):
                continue
            state[client] = state.get(client, 0) + amount if op == "increment" else 0
        return state


Span = tuple[str, int]
Headers = list[tuple[str, bytes]]


def simulate(seed: int, events: int = 400, clients: int = 24, per_partition: int = 3,
             late_writes: bool = False) -> tuple[HandoffLogs, list[tuple[int, int]]]:
    """Logs of `events` ledger events of `clients` clients over `per_partition` hash-range slots,
    their transactions interleaved at random, an owner killed now and then and every slot's last
    transaction torn; and the (sink, changelog) lengths after each transaction, where a read-ahead
    may have stopped.

    `late_writes`: an owner is frozen rather than killed, and the changelog records its torn
    transaction had in flight land late, after some of its successor's transactions (tansu appends a
    produce that passed its fencing check before the successor's init_transactions whenever it gets
    to it)."""
    rng = random.Random(seed)
    late: list[tuple[int, list[tuple[Span, bytes, bytes | None, Headers]]]] = []
    """(how many more transactions before they land, changelog records) of frozen owners."""
    layout = SlotLayout(1, per_partition)
    sink, state_log = (SETTINGS.sink, 0), (SETTINGS.state, 0)
    logs: dict[Span, list[Record]] = {(SETTINGS.topic, 0): [], sink: [], (SETTINGS.dlq, 0): [], state_log: []}
    evs: list[tuple[int, str, int]] = []
    for offset in range(events):
        client = rng.randrange(clients)
        op = "drain" if rng.random() < 0.1 else "increment"
        evs.append((client, op, rng.randrange(1, 100)))
        key, value = encode_input(client, f"u{offset}", 1_000 + offset)
        logs[(SETTINGS.topic, 0)].append(Record(offset, 1_000 + offset, 1_000 + offset, value, key))
    sim = HandoffLogs(layout, evs, logs)
    writers = [SlotWriter(s, [o for o, (c, _, _) in enumerate(evs) if sim.slot_of(c) == s])
               for s in range(per_partition)]
    ends: list[tuple[int, int]] = []

    def append(span: Span, key: bytes, value: bytes | None, headers: Headers) -> int:
        log = logs[span]
        log.append(Record(len(log), 0, 0, value, key, headers))
        return len(log) - 1

    def commit(w: SlotWriter, torn: bool) -> None:
        batch = w.finished[w.committed_upto:]
        w.committed_upto = len(w.finished)
        done = set(w.finished)
        unfinished = [o for o in w.offsets if o not in done]
        committable = min(unfinished) if unfinished else events
        outputs: list[tuple[int, bytes, bytes, Headers]] = []
        dirty: dict[int, int] = dict(w.relog)
        w.relog = {}
        for offset in batch:
            client = evs[offset][0]
            record = {"clientId": client, "uuid": f"u{offset}", "created": 1_000 + offset, "partition": 0,
                      "offset": offset, "result": None}
            outputs.append((offset, str(client).encode(), json_bytes(record),
                            [(GROUP_HEADER, b"g"), (STATE_HEADER, json_bytes(w.after[offset]))]))
            dirty[client] = offset
        changes = [(state_log, str(c).encode(), json_bytes(w.after[o]), [(SOURCE_OFFSET_HEADER, str(o).encode())])
                   for c, o in dirty.items()]
        snapshot = w.since_snapshot > 20 and rng.random() < 0.5
        if snapshot:
            changes += [(state_log, str(c).encode(), json_bytes(v),
                         [(SOURCE_OFFSET_HEADER, str(w.state_offsets[c]).encode())]) for c, v in w.state.items()]
        totals_headers = [(SOURCE_OFFSET_HEADER, str(committable).encode())]
        if w.snapshot_start is not None:
            totals_headers.append((SNAPSHOT_HEADER, str(w.snapshot_start).encode()))
        totals = (state_log, totals_key(w.slot, per_partition), encode_totals(0, 0, 0), totals_headers)
        if torn:
            outputs = outputs[:rng.randint(0, len(outputs))]
            kept = rng.randint(0, len(changes))
            whole = kept == len(changes) and len(outputs) == len(batch)
            if late_writes and not whole:
                late.append((rng.randint(1, 4), changes[kept:]))
            changes = changes[:kept] + ([totals] if whole and rng.random() < 0.5 else [])
        else:
            changes.append(totals)
        for offset, key, value, headers in outputs:
            append(sink, key, value, headers)
            sim.processed.add(offset)
        first = None
        for i, (span, key, value, headers) in enumerate(changes):
            at = append(span, key, value, headers)
            if snapshot and i == len(dirty):
                first = at
        w.since_snapshot += len(changes)
        if snapshot and not torn:
            w.snapshot_start, w.since_snapshot = first if first is not None else len(logs[state_log]) - 1, 0
        for i, (wait, records) in reversed(list(enumerate(late))):
            if wait > 1:
                late[i] = (wait - 1, records)
                continue
            del late[i]
            for span, key, value, headers in records:
                append(span, key, value, headers)
        ends.append((len(logs[sink]), len(logs[state_log])))

    def restart(w: SlotWriter) -> None:
        # A killed owner's successor resumes from what became visible; the events of the torn
        # transaction without a visible processed record run again.
        committed, restored_slots = restore_from(logs, layout, [w.slot])
        restored = restored_slots[w.slot]
        w.finished = [o for o in w.finished if o < committed[w.slot] or o in restored.finished_offsets]
        w.committed_upto = len(w.finished)
        w.state, w.state_offsets = dict(restored.state), dict(restored.state_offsets)
        # As slot.py does: the states taken from processed records go to the changelog again.
        w.relog = dict(restored.from_outputs)
        w.after.update((o, restored.state[c]) for c, o in restored.from_outputs.items())

    for _ in range(events * 2):
        w = rng.choice(writers)
        done = set(w.finished)
        # Any client's next event may finish: clients finish out of order, each in log order.
        ready, seen = [], set()
        for o in w.offsets:  # ascending: a client's first pending offset is its next event
            if o not in done and evs[o][0] not in seen:
                seen.add(evs[o][0])
                ready.append(o)
        if ready and rng.random() < 0.8:
            offset = rng.choice(ready)
            client, op, amount = evs[offset]
            w.state[client] = w.state.get(client, 0) + amount if op == "increment" else 0
            w.state_offsets[client] = offset
            w.after[offset] = w.state[client]
            w.finished.append(offset)
        elif w.committed_upto < len(w.finished):
            killed = rng.random() < 0.1
            commit(w, torn=killed)
            if killed:
                restart(w)
    for w in writers:
        if w.committed_upto < len(w.finished):
            commit(w, torn=True)
    return sim, ends


def restore_from(logs: dict[Span, list[Record]], layout: SlotLayout,
                 slots: list[int]) -> tuple[dict[int, int], dict[int, RestoredPartition]]:
    """Where each of `slots` resumes in `logs`, and its full restore from there."""
    committed = slot_starts(ModelReader(logs), SETTINGS.topic, SETTINGS.state, slots, layout)  # type: ignore[arg-type]
    return committed, restore_with(ModelReader(logs), SETTINGS, committed, COUNTS, NOW_S, layout)  # type: ignore[arg-type]
