"""Everything a worker keeps for one held slot, and the only code that writes it (SlotState).

Called by the stages, each through the few methods it needs (its own Protocol, or this class):
intake.py admits fetched offsets and drops duplicates; attempts.py reads a client's state and
finishes an offset with its outcome and output records; committer.py takes a commit batch and
reports it committed (`CommitSlot`); engine.py pauses, resumes and revokes the slot and reads its
gauges. No other module assigns a field of it.

A slot is the work a worker holds. Today a slot is one partition of the input topic; code that
needs the Kafka partition reads `partition`, code that needs the slot's identity reads `slot`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType

from confluent_kafka import KafkaError, Message, TopicPartition
from prometheus_client import Gauge

from keyrange import metrics
from keyrange.events import SNAPSHOT_HEADER, SOURCE_OFFSET_HEADER, TOTALS_KEY, ClientId, encode_totals, json_bytes
from keyrange.worker.commitwindow import CommitWindow, Outcome, Totals
from keyrange.worker.dedup import TtlSet
from keyrange.worker.restore import RestoredPartition
from keyrange.worker.snapshots import SnapshotSchedule
from keyrange.worker.transactions import OutputRecord, SlotTransactions

MAX_PLACED_CLIENTS = 100_000
"""Clients remembered per slot as correctly placed (checked once each); cleared past this."""


class SlotMetrics:
    """The metric children of one slot, bound once (label lookups are slow per event). The label
    is still `partition`: the dashboards and alert rules read it."""

    __slots__ = (
        "consumed", "dead_letters", "dedup_entries", "duplicates", "labels", "lag", "lag_seconds", "misplaced",
        "paused", "pending", "processed", "skewed_ahead", "skewed_behind",
    )

    def __init__(self, consumer: str, worker: str, partition: int | str) -> None:
        self.labels = (consumer, worker, str(partition))
        self.consumed = metrics.EVENTS_CONSUMED.labels(*self.labels)
        self.processed = metrics.EVENTS_PROCESSED.labels(*self.labels)
        self.duplicates = metrics.DUPLICATES_DROPPED.labels(*self.labels)
        self.dead_letters = metrics.DEAD_LETTERS
        self.dedup_entries = metrics.DEDUP_ENTRIES.labels(*self.labels)
        self.pending = metrics.PENDING_EVENTS.labels(*self.labels)
        self.paused = metrics.PARTITION_PAUSED.labels(*self.labels)
        self.lag: Gauge | None = None  # exported once measured (`show_lag`)
        self.lag_seconds = metrics.CONSUMER_LAG_SECONDS.labels(*self.labels)
        self.skewed_ahead = metrics.CLOCK_SKEWED_EVENTS.labels(*self.labels, "ahead")
        self.skewed_behind = metrics.CLOCK_SKEWED_EVENTS.labels(*self.labels, "behind")
        self.misplaced = metrics.MISPLACED_EVENTS.labels(*self.labels)

    def dead_letter(self, reason: str) -> None:
        """Count one dead letter with its reason code."""
        self.dead_letters.labels(*self.labels, reason).inc()

    def show_lag(self, records: int) -> None:
        """Export the slot's lag in records."""
        if self.lag is None:
            self.lag = metrics.CONSUMER_LAG.labels(*self.labels)
        self.lag.set(records)

    def hide_lag(self) -> None:
        """Stop exporting the slot's lag: unknown (its partition's end could not be read) is not 0."""
        if self.lag is not None:
            self.lag = None
            with contextlib.suppress(KeyError):
                metrics.CONSUMER_LAG.remove(*self.labels)

    def remove(self) -> None:
        """Drop the gauges of a released slot so they do not report stale values."""
        for gauge in (metrics.DEDUP_ENTRIES, metrics.PENDING_EVENTS, metrics.PARTITION_PAUSED,
                      metrics.CONSUMER_LAG, metrics.CONSUMER_LAG_SECONDS):
            with contextlib.suppress(KeyError):
                gauge.remove(*self.labels)


class SnapshotStart:
    """The offset of a snapshot's first record, from its delivery report (producer thread)."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset: int | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.offset = message.offset()


@dataclass(slots=True)
class CommitBatch:
    """What one slot's transaction carries, and what to count once it committed."""

    records: list[OutputRecord]
    offsets: list[TopicPartition]
    committable: int
    processed: int
    dead_letters: list[str]
    """Reasons of the dead letters among `records` (and of those too large to write)."""
    totals: Totals | None
    """The totals its totals record commits (None: it carries none)."""
    duplicates: int
    """Duplicates dropped below `committable` and above the last committed offset."""
    changelog_records: int
    snapshot: SnapshotStart | None
    """Where the snapshot this transaction writes starts, if it writes one."""
    names_snapshot: int | None
    """The snapshot start its totals record names (None: no totals record, or none named)."""
    last: list[OutputRecord] = field(default_factory=list)
    """A hash-range slot's totals record: its position, written once `records` were acknowledged
    (a whole partition's position is `offsets`)."""


class SlotState:
    """A held slot: commit window, dedup window, keyed state and outputs not yet committed."""

    __slots__ = (
        "_committed_offset",
        "_committed_totals",
        "_consumed",
        "_dead_letters",
        "_dedup",
        "_dirty_state",
        "_drained",
        "_metrics",
        "_output_partition",
        "_outputs",
        "_partition",
        "_parts",
        "_paused",
        "_placed_clients",
        "_processed",
        "_restored_totals",
        "_revoked",
        "_running",
        "_skip",
        "_slot",
        "_snapshots",
        "_store",
        "_store_offsets",
        "_store_view",
        "_taken",
        "_totals_key",
        "_transactions",
        "_warned_misplaced",
        "_window",
    )

    def __init__(self, slot: int, partition: int, restored: RestoredPartition, ttl_seconds: float,
                 wall_clock: Callable[[], float], slot_metrics: SlotMetrics, transactions: SlotTransactions,
                 output_partition: int | None, totals_key: bytes = TOTALS_KEY, parts: int = 1) -> None:
        self._slot = slot
        self._partition = partition
        self._totals_key = totals_key
        """The changelog key of its totals records (events.totals_key): a hash range's own."""
        self._parts = parts
        """The hash ranges its partition is cut into: its lag is its share of the partition's records."""
        self._transactions = transactions
        self._window = CommitWindow(restored.start_offset)
        self._committed_offset = restored.start_offset
        """The offset last committed for this slot (or where it started)."""
        self._restored_totals = restored.totals
        """How the offsets below the offset this acquire started from finished."""
        self._committed_totals = restored.totals
        """How the offsets below _committed_offset finished."""
        self._taken: CommitBatch | None = None
        """The batch last taken, until it committed: a release may take the next one meanwhile."""
        self._skip = restored.finished_offsets
        """Offsets already finished before this acquire (outputs exist), with how: not run again."""
        self._dedup = TtlSet(ttl_seconds, wall_clock)
        for uuid, event_time_s in restored.seen:
            self._dedup.replay(uuid, event_time_s)
        self._store: dict[ClientId, bytes] = {client: json_bytes(value) for client, value in restored.state.items()}
        """clientId -> committed keyed state as JSON (as applied by finished events; as the changelog
        holds it, so memory always matches what a restore would rebuild)."""
        self._store_view = MappingProxyType(self._store)
        self._store_offsets: dict[ClientId, int] = dict(restored.state_offsets)
        """clientId -> input offset of the event that set its state in `_store` (when known)."""
        self._snapshots = SnapshotSchedule(restored.snapshot_start, restored.changelog_records)
        """When the slot writes its next changelog snapshot, and which one its totals records name."""
        self._outputs: list[OutputRecord] = []
        """Processed records and dead letters finished since the last transaction."""
        # States the restore took from processed records past the committed offset: their changelog
        # records may be missing (a torn transaction), which a later restore would need.
        self._dirty_state: dict[ClientId, tuple[bytes | None, int]] = {
            client: (self._store.get(client), offset) for client, offset in restored.from_outputs.items()}
        """clientId -> (encoded state, None for a tombstone; input offset of the event that set it),
        to changelog in the next transaction."""
        self._processed = 0
        """Processed records in `_outputs` (counted once their transaction commits)."""
        self._dead_letters: list[str] = []
        """Reasons of the dead letters in `_outputs` (counted once their transaction commits)."""
        self._consumed = 0
        """Offsets admitted and not yet counted as consumed (`take_consumed`)."""
        self._revoked = False
        self._paused = False
        self._placed_clients: set[ClientId] = set()
        self._warned_misplaced = False
        self._running = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._metrics = slot_metrics
        self._output_partition = output_partition

    # --- identity and what others read -------------------------------------------------------

    @property
    def whole_partition(self) -> bool:
        """Whether the slot is its whole partition (its transactions commit the group's offset), not
        a hash range of it (ranges/layout.py: its position is its totals record)."""
        return self._totals_key == TOTALS_KEY

    @property
    def slot(self) -> int:
        """The slot's identity (its transactional id, its place in the range map)."""
        return self._slot

    @property
    def partition(self) -> int:
        """The input topic's partition the slot reads."""
        return self._partition

    @property
    def output_partition(self) -> int | None:
        """Sink partition of the slot's processed records (None: the producer picks by key)."""
        return self._output_partition

    @property
    def transactions(self) -> SlotTransactions:
        """The slot's transactional producer, initialised (this worker fenced earlier owners)."""
        return self._transactions

    @property
    def metrics(self) -> SlotMetrics:
        """The slot's metric children."""
        return self._metrics

    @property
    def revoked(self) -> bool:
        """Set on release: nothing more of this slot starts; queued events are skipped."""
        return self._revoked

    @property
    def paused(self) -> bool:
        """Paused in the consumer for backpressure (see `wants_pause`)."""
        return self._paused

    @property
    def running(self) -> int:
        """Handler calls in flight for this slot."""
        return self._running

    @property
    def committed_offset(self) -> int:
        """The offset last committed for this slot (or where it started)."""
        return self._committed_offset

    @property
    def committed_totals(self) -> Totals:
        """How the offsets below `committed_offset` finished."""
        return self._committed_totals

    @property
    def committable(self) -> int:
        """The offset a commit would commit now: the lowest unfinished one (commitwindow.py)."""
        return self._window.committable

    @property
    def next_offset(self) -> int:
        """The offset after the last one fetched."""
        return self._window.next_offset

    @property
    def pending(self) -> int:
        """Fetched offsets not yet committable."""
        return self._window.pending

    @property
    def pending_bytes(self) -> int:
        """Bytes (record values) of the pending offsets."""
        return self._window.pending_bytes

    @property
    def finished_ahead(self) -> int:
        """Offsets finished behind an unfinished one (committable once it finishes)."""
        return self._window.finished_ahead

    @property
    def dedup_entries(self) -> int:
        """Uuids in the dedup window."""
        return len(self._dedup)

    @property
    def stream_time(self) -> float:
        """The newest event time the dedup window has seen (seconds)."""
        return self._dedup.stream_time

    @property
    def states(self) -> Mapping[ClientId, bytes]:
        """clientId -> committed keyed state as JSON, read-only."""
        return self._store_view

    @property
    def state_offsets(self) -> Mapping[ClientId, int]:
        """clientId -> input offset of the event that set its state (when known), read-only."""
        return MappingProxyType(self._store_offsets)

    @property
    def snapshot_start(self) -> int | None:
        """Changelog offset of the newest committed snapshot (None: none known)."""
        return self._snapshots.start

    @property
    def placed_clients(self) -> Set[ClientId]:
        """Clients seen on this slot whose murmur2 partition it is (intake.py), read-only."""
        return self._placed_clients

    def state_of(self, client: ClientId) -> bytes | None:
        """The client's committed state as JSON, or None."""
        return self._store.get(client)

    # --- intake ------------------------------------------------------------------------------

    def admit(self, offset: int, timestamp_ms: int, size_bytes: int) -> bool:
        """Add a fetched offset to the window (counted as consumed, see `take_consumed`); False when
        there is nothing to run: the slot is revoked (fetched just before a release: the new owner
        handles it), the offset is already in the window (delivered again, e.g. after a resume:
        not counted), or an earlier owner finished it (its outputs exist: finished here with that
        outcome, its uuid joins the dedup window at its place in the log)."""
        window = self._window
        if self._revoked or offset < window.next_offset:
            return False
        self._consumed += 1
        window.add(offset, timestamp_ms, size_bytes)
        finished = self._skip.pop(offset, None)
        if finished is None:
            return True
        if finished.uuid is not None:  # at the time the intake gave it (intake.py)
            self._dedup.add_if_new(finished.uuid, finished.created_s or timestamp_ms / 1000)
        window.finish(offset, finished.outcome)
        return False

    def pass_offset(self, offset: int) -> None:
        """An offset of the slot's partition that belongs to another slot (layout.py): the
        committable offset may move past it."""
        self._window.pass_offset(offset)

    def take_consumed(self) -> int:
        """Offsets admitted since the last call (for the consumed counters)."""
        consumed, self._consumed = self._consumed, 0
        return consumed

    def first_seen(self, offset: int, uuid: str, event_s: float) -> bool:
        """Whether `uuid` is new to the dedup window (it joins it); a duplicate's offset finishes
        here, counted when its offset commits (one whose offset never commits here is dropped, and
        counted, by the slot's next owner)."""
        if self._dedup.add_if_new(uuid, event_s):
            return True
        self._window.finish(offset, Outcome.DUPLICATE)
        return False

    def place(self, client: ClientId) -> None:
        """Remember that `client` belongs on this slot (checked once)."""
        if len(self._placed_clients) >= MAX_PLACED_CLIENTS:
            self._placed_clients.clear()
        self._placed_clients.add(client)

    def first_misplaced(self) -> bool:
        """True the first time a misplaced client is found here (warned once per slot)."""
        first, self._warned_misplaced = not self._warned_misplaced, True
        return first

    # --- handler calls and their outcomes ----------------------------------------------------

    def call_started(self) -> bool:
        """A handler call of this slot starts; False (and it does not) when the slot is revoked."""
        if self._revoked:
            return False
        self._running += 1
        self._drained.clear()
        return True

    def call_ended(self) -> None:
        """A handler call that `call_started` ended."""
        self._running -= 1
        if self._running == 0:
            self._drained.set()

    def finish_processed(self, offset: int, record: OutputRecord, client: ClientId, state_json: bytes | None,
                         state_deleted: bool) -> None:
        """A handled event at `offset` finished: its processed record is staged, and its client's new
        state (`state_json`, or `state_deleted`) goes into the store and, with the next transaction,
        into the changelog."""
        if state_deleted:
            self.change_state(client, None, offset)
        elif state_json is not None:
            self.change_state(client, state_json, offset)
        self._outputs.append(record)
        self._processed += 1
        self._window.finish(offset, Outcome.HANDLED)

    def finish_dead_lettered(self, offset: int, record: OutputRecord | None, reason: str) -> None:
        """The event at `offset` was dead-lettered for `reason`: its dead letter is staged (None: it
        fits nowhere and is not written) and its offset finishes."""
        if record is not None:
            self._outputs.append(record)
        self._dead_letters.append(reason)
        self._window.finish(offset, Outcome.DEAD_LETTERED)

    def change_state(self, client: ClientId, state_json: bytes | None, offset: int) -> None:
        """A finished event at `offset` set its client's state (None: deleted): into the store, and
        into the changelog with the next transaction."""
        if state_json is None:
            self._store.pop(client, None)
            self._store_offsets.pop(client, None)
        else:
            self._store[client] = state_json
            self._store_offsets[client] = offset
        self._dirty_state[client] = (state_json, offset)

    # --- backpressure, release and gauges (engine.py) ----------------------------------------

    def wants_pause(self, max_pending: int, max_pending_bytes: int) -> bool:
        """True when more than `max_pending` fetched events, or more than `max_pending_bytes` of
        them, are not yet committable: stop fetching."""
        window = self._window
        return not self._paused and (window.pending > max_pending or window.pending_bytes > max_pending_bytes)

    def wants_resume(self, max_pending: int, max_pending_bytes: int) -> bool:
        """True when a paused slot is down to half of both limits: fetch again. Half, not just
        below them, so a slot does not flap every fetch."""
        window = self._window
        return self._paused and window.pending <= max_pending // 2 and window.pending_bytes <= max_pending_bytes // 2

    def set_paused(self, paused: bool) -> None:
        """The consumer paused (True) or resumed (False) fetching the slot."""
        self._paused = paused
        self._metrics.paused.set(1 if paused else 0)

    def revoke(self) -> None:
        """Being released: nothing more of it starts, and queued events are skipped."""
        self._revoked = True

    async def drained(self) -> None:
        """Return once no handler call of the slot runs."""
        await self._drained.wait()

    def discard(self) -> None:
        """Released: drop what it staged and did not commit (its next owner produces it again) and
        its gauges."""
        self._outputs.clear()
        self._dirty_state.clear()
        self._metrics.remove()

    def report(self, high_watermark: int, now_ms: float) -> tuple[int, float]:
        """Set the slot's gauges; return its lag in records (`high_watermark` -1: unknown, 0) and
        the age of its oldest unfinished event in seconds."""
        window, m = self._window, self._metrics
        m.dedup_entries.set(len(self._dedup))
        m.pending.set(window.pending)
        if high_watermark >= 0:
            lag = max(0, high_watermark - window.committable)
            if self._parts > 1:
                lag = -(-lag // self._parts)  # the records past it are all its partition's, its share of them its own
            m.show_lag(lag)
        else:
            lag = 0
            m.hide_lag()
        oldest = window.oldest_timestamp_ms
        age_s = max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0
        m.lag_seconds.set(age_s)
        return lag, age_s

    # --- commits (committer.py) --------------------------------------------------------------

    def take_batch(self, topic: str, state_topic: str) -> CommitBatch | None:
        """Hand over what the slot's next transaction carries (None: nothing): the outputs and
        state changes finished since the last one, and when the committable offset moved (or a
        snapshot is due, or the newest one is not yet named) the totals record committing it,
        after a snapshot of every client's state when one is due (snapshots.py). Taken while the
        last one is in flight (a release's, to join its transaction), it counts from that one."""
        base = self._taken if self._taken is not None and self._taken.totals is not None else None
        committed_offset = self._committed_offset if base is None else base.committable
        committed_totals = self._committed_totals if base is None or base.totals is None else base.totals
        changelog_records = len(self._dirty_state)
        records = self._take_outputs(state_topic)
        processed, self._processed = self._processed, 0
        dead_letters, self._dead_letters = self._dead_letters, []
        committable = self._window.committable
        offsets: list[TopicPartition] = []
        totals = None
        snapshot = None
        names = None
        duplicates = 0
        last: list[OutputRecord] = []
        # one snapshot in flight at a time: its start is known only once it committed
        snapshot_in_flight = self._taken is not None and self._taken.snapshot is not None
        take_snapshot = not snapshot_in_flight and self._snapshots.due(len(self._store))
        if committable > committed_offset or take_snapshot or not self._snapshots.named:
            whole = self.whole_partition
            # A whole partition's position is the group's offset; a hash range's, its totals record
            # (positions.py): the partition's other slots are at other offsets.
            if committable > committed_offset and whole:
                offsets.append(TopicPartition(topic, self._partition, committable))
            # A snapshot is every live client's state, then the totals record; it starts at its
            # first record (the totals record when no client has a state).
            written = self._snapshot_records(state_topic) if take_snapshot else []
            record, totals = self._totals_record(state_topic, committable)
            (written if whole else last).append(record)
            if take_snapshot:
                snapshot = (written or last)[0].delivered = SnapshotStart()
            records.extend(written)
            changelog_records += len(written) + len(last)
            names = self._snapshots.start
            duplicates = totals.duplicates_dropped - committed_totals.duplicates_dropped
        if not records and not last:
            return None
        self._taken = CommitBatch(records, offsets, committable, processed, dead_letters, totals, duplicates,
                                  changelog_records, snapshot, names, last)
        return self._taken

    def committed(self, batch: CommitBatch) -> None:
        """`batch` (the oldest one taken and not reported yet) committed: its offset and totals are
        the committed ones, its counts go to the metrics, and the snapshot schedule learns what the
        changelog got."""
        if batch is self._taken:
            self._taken = None
        m = self._metrics
        if batch.processed:
            m.processed.inc(batch.processed)
        for reason in batch.dead_letters:
            m.dead_letter(reason)
        if batch.totals is not None:
            m.duplicates.inc(batch.duplicates)
            self._committed_offset, self._committed_totals = batch.committable, batch.totals
        snapshot_at = None if batch.snapshot is None else batch.snapshot.offset
        self._snapshots.committed(batch.changelog_records, snapshot_at, batch.snapshot is not None,
                                  batch.names_snapshot)

    def _take_outputs(self, state_topic: str) -> list[OutputRecord]:
        """The outputs and state changes finished since the last transaction, handed over."""
        records = self._outputs
        self._outputs = []
        if self._dirty_state:
            p = self._partition
            records.extend(OutputRecord(state_topic, p, str(client).encode(), value,
                                        [(SOURCE_OFFSET_HEADER, str(offset).encode())])
                           for client, (value, offset) in self._dirty_state.items())
            self._dirty_state = {}
        return records

    def _totals_record(self, state_topic: str, committable: int) -> tuple[OutputRecord, Totals]:
        """The totals of the offsets below `committable`, and the changelog record that commits
        them with that offset (restore.py reads it back, so the counts survive handoffs and crashes);
        it names the newest committed snapshot (snapshots.py)."""
        totals = self._restored_totals.plus(self._window.passed)
        value = encode_totals(totals.handled, totals.dead_lettered, totals.duplicates_dropped)
        headers = [(SOURCE_OFFSET_HEADER, str(committable).encode())]
        if self._snapshots.start is not None:
            headers.append((SNAPSHOT_HEADER, str(self._snapshots.start).encode()))
        return OutputRecord(state_topic, self._partition, self._totals_key, value, headers), totals

    def _snapshot_records(self, state_topic: str) -> list[OutputRecord]:
        """Every live client's state as changelog records (snapshots.py), each with the offset of the
        event that set it when known (a record without one counts as older than any committed offset,
        as the changelog's oldest records do)."""
        offsets = self._store_offsets
        return [OutputRecord(state_topic, self._partition, str(client).encode(), value,
                             [(SOURCE_OFFSET_HEADER, str(offsets[client]).encode())] if client in offsets else None)
                for client, value in self._store.items()]
