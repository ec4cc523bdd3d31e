"""Everything a worker keeps for one held partition (slot): its lease on the work."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from keyrange import metrics
from keyrange.events import SNAPSHOT_HEADER, SOURCE_OFFSET_HEADER, TOTALS_KEY, ClientId, encode_totals, json_bytes
from keyrange.worker.commitwindow import CommitWindow, Totals
from keyrange.worker.dedup import TtlSet
from keyrange.worker.restore import RestoredPartition
from keyrange.worker.snapshots import SnapshotSchedule
from keyrange.worker.transactions import OutputRecord, SlotTransactions


class PartitionMetrics:
    """The metric children of one partition, bound once (label lookups are slow per event)."""

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
        self.lag = metrics.CONSUMER_LAG.labels(*self.labels)
        self.lag_seconds = metrics.CONSUMER_LAG_SECONDS.labels(*self.labels)
        self.skewed_ahead = metrics.CLOCK_SKEWED_EVENTS.labels(*self.labels, "ahead")
        self.skewed_behind = metrics.CLOCK_SKEWED_EVENTS.labels(*self.labels, "behind")
        self.misplaced = metrics.MISPLACED_EVENTS.labels(*self.labels)

    def dead_letter(self, reason: str) -> None:
        """Count one dead letter with its reason code."""
        self.dead_letters.labels(*self.labels, reason).inc()

    def remove(self) -> None:
        """Drop the gauges of a released partition so they do not report stale values."""
        for gauge in (metrics.DEDUP_ENTRIES, metrics.PENDING_EVENTS, metrics.PARTITION_PAUSED,
                      metrics.CONSUMER_LAG, metrics.CONSUMER_LAG_SECONDS):
            with contextlib.suppress(KeyError):
                gauge.remove(*self.labels)


class PartitionState:
    """A held partition: commit window, dedup window, keyed state and outputs not yet committed."""

    def __init__(self, partition: int, restored: RestoredPartition, ttl_seconds: float,
                 wall_clock: Callable[[], float], partition_metrics: PartitionMetrics,
                 transactions: SlotTransactions, slot: int | None = None, totals_key: bytes = TOTALS_KEY) -> None:
        self.partition = partition
        """The input partition the slot lies in (Kafka's: fetch, outputs, changelog)."""
        self.slot = partition if slot is None else slot
        """The slot's number in the range map: its partition, or a hash range of it (layout.py)."""
        self.totals_key = totals_key
        """The changelog key of its totals records (events.totals_key)."""
        self.whole_partition = totals_key == TOTALS_KEY
        """Whether the slot is its whole partition: its transactions commit the group's offset."""
        self.transactions = transactions
        """The slot's transactional producer, initialised (this worker fenced earlier owners)."""
        self.window = CommitWindow(restored.start_offset)
        self.committed_offset = restored.start_offset
        """The offset last committed for this partition (or where it started)."""
        self.restored_totals = restored.totals
        """How the offsets below the offset this acquire started from finished."""
        self.committed_totals = restored.totals
        """How the offsets below committed_offset finished."""
        self.skip = restored.finished_offsets
        """Offsets already finished before this acquire (outputs exist), with how: not run again."""
        self.dedup = TtlSet(ttl_seconds, wall_clock)
        for uuid, event_time_s in restored.seen:
            self.dedup.replay(uuid, event_time_s)
        self.store: dict[ClientId, bytes] = {client: json_bytes(value) for client, value in restored.state.items()}
        """clientId -> committed keyed state as JSON (as applied by finished events; as the changelog
        holds it, so memory always matches what a restore would rebuild)."""
        self.store_offsets: dict[ClientId, int] = dict(restored.state_offsets)
        """clientId -> input offset of the event that set its state in `store` (when known)."""
        self.snapshots = SnapshotSchedule(restored.snapshot_start, restored.changelog_records)
        """When the slot writes its next changelog snapshot, and which one its totals records name."""
        self.outputs: list[OutputRecord] = []
        """Processed records and dead letters finished since the last transaction."""
        self.dirty_state: dict[ClientId, tuple[bytes | None, int]] = {}
        """clientId -> (encoded state, None for a tombstone; input offset of the event that set it),
        to changelog in the next transaction."""
        self.processed_uncommitted = 0
        self.dead_letters_uncommitted: list[str] = []
        """Reasons of the dead letters in `outputs` (counted once their transaction commits)."""
        self.revoked = False
        """Set on release: nothing more of this partition starts; queued events are skipped."""
        self.lost = False
        """Its producer failed (fenced, or gave up retrying): nothing of it commits any more, and it
        is released without committing (engine.py `SlotFailure`)."""
        self.paused = False
        """Paused in the consumer for backpressure (see `wants_pause`)."""
        self.placed_clients: set[ClientId] = set()
        """Clients seen on this partition whose murmur2 partition it is (intake.py)."""
        self.warned_misplaced = False
        self.running = 0
        """Handler calls in flight for this partition."""
        self.drained = asyncio.Event()
        self.drained.set()
        self.metrics = partition_metrics
        self.output_partition: int | None = partition
        """Sink partition of this partition's processed records (None: the producer picks by key)."""

    def wants_pause(self, max_pending: int, max_pending_bytes: int) -> bool:
        """True when more than `max_pending` fetched events, or more than `max_pending_bytes` of
        them, are not yet committable: stop fetching."""
        window = self.window
        return not self.paused and (window.pending > max_pending or window.pending_bytes > max_pending_bytes)

    def wants_resume(self, max_pending: int, max_pending_bytes: int) -> bool:
        """True when a paused partition is down to half of both limits: fetch again. Half, not just
        below them, so a partition does not flap every fetch."""
        window = self.window
        return self.paused and window.pending <= max_pending // 2 and window.pending_bytes <= max_pending_bytes // 2

    def change_state(self, client: ClientId, state_json: bytes | None, offset: int) -> None:
        """A finished event at `offset` set its client's state (None: deleted): into the store, and
        into the changelog with the next transaction."""
        if state_json is None:
            self.store.pop(client, None)
            self.store_offsets.pop(client, None)
        else:
            self.store[client] = state_json
            self.store_offsets[client] = offset
        self.dirty_state[client] = (state_json, offset)

    def take_outputs(self, state_topic: str) -> tuple[list[OutputRecord], int, list[str]]:
        """Hand over the outputs and state changes for a transaction; return them, the processed
        count and the dead letters' reasons."""
        records = self.outputs
        self.outputs = []
        if self.dirty_state:
            p = self.partition
            records.extend(OutputRecord(state_topic, p, str(client).encode(), value,
                                        [(SOURCE_OFFSET_HEADER, str(offset).encode())])
                           for client, (value, offset) in self.dirty_state.items())
            self.dirty_state = {}
        processed, self.processed_uncommitted = self.processed_uncommitted, 0
        dead_letters, self.dead_letters_uncommitted = self.dead_letters_uncommitted, []
        return records, processed, dead_letters

    def totals_record(self, state_topic: str, committable: int) -> tuple[OutputRecord, Totals]:
        """The totals of the offsets below `committable`, and the changelog record that commits
        them with that offset (restore.py reads it back, so the counts survive handoffs and crashes);
        it names the newest committed snapshot (snapshots.py)."""
        totals = self.restored_totals.plus(self.window.passed)
        value = encode_totals(totals.handled, totals.dead_lettered, totals.duplicates_dropped)
        headers = [(SOURCE_OFFSET_HEADER, str(committable).encode())]
        if self.snapshots.start is not None:
            headers.append((SNAPSHOT_HEADER, str(self.snapshots.start).encode()))
        return OutputRecord(state_topic, self.partition, self.totals_key, value, headers), totals

    def snapshot_records(self, state_topic: str) -> list[OutputRecord]:
        """Every live client's state as changelog records (snapshots.py), each with the offset of the
        event that set it when known (a record without one counts as older than any committed offset,
        as the changelog's oldest records do)."""
        offsets = self.store_offsets
        return [OutputRecord(state_topic, self.partition, str(client).encode(), value,
                             [(SOURCE_OFFSET_HEADER, str(offsets[client]).encode())] if client in offsets else None)
                for client, value in self.store.items()]
