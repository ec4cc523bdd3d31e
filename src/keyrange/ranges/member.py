"""The worker's side of the control channel: follow the newest publication, release, acquire, report.

A worker in controlled mode runs one `RangeMember` next to its engine. On every newer epoch it
first releases what the epoch does not allow it (fencing: a slot it does not hold in the newest
epoch it has seen is never handled again), reports, then acquires what the epoch newly allows,
and reports again (a worker that only acquires and is not awaited reports once, after the
acquire). Between epochs it sends a heartbeat report every `heartbeat_seconds`.

Its steps in the phases of a handoff (the controller's side is handoff.py; it waits on these reports):
- STARTING (a split's new worker): its first report, a heartbeat, is what the controller waits for.
- READING_AHEAD: when a prepare record from the newest epoch names slots for it, a new owner reads
  their logs ahead in the background (`SlotOwner.prefetch`, while the old owner still handles
  them) and reports them warm (`warm`, `warm_epoch`); a read-ahead that fails reports nothing.
- IN_TRANSIT (epoch E): an old owner releases the moved slots (`SlotOwner.release`: stop fetching,
  finish in-flight, commit) and reports E without them. A release that raises ends the member: the
  worker stops, its last report is of the older epoch, and once restarted it reports E holding
  nothing. A new owner acquires nothing of them yet, and notes since when each has been in transit
  towards it.
- GRANTED (epoch E+1): a new owner acquires the moved slots (`SlotOwner.acquire`: restore, then
  consume from the committed offsets; after a read-ahead only what was appended since is read),
  reports E+1, and the pause of each slot is measured at its first event (pauses.py).

One process per worker id: each member is an instance whose claim is the offset of its first
report. A member that reads a newer claim on its own worker id from another process (a pod
force-deleted and replaced while still running, a second `keyrange worker --worker-id N`) stands
down: it raises `IdentityTaken` and never reports again, so the newer process keeps the id. Two
members of one id would otherwise fence each other's slot producers in turn, forever, both running
handler calls. A restarted worker is a newer claim; the process it replaces is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Collection, Mapping, Set
from typing import Protocol

from confluent_kafka import KafkaException

from keyrange.errors import UserError
from keyrange.kafkaquirks import Backoff, TransactionFailed
from keyrange.ranges.channel import ControlChannel, ControlWriteFailed, Prepare, Publication, WorkerReport, now_ms
from keyrange.ranges.ownership import in_transit_towards, to_acquire, to_release
from keyrange.ranges.pauses import HandoffPauses
from keyrange.ranges.slots import format_slot_list

log = logging.getLogger(__name__)


class SlotOwner(Protocol):
    """The engine API a member drives (keyrange.worker.Worker provides it)."""

    @property
    def held_slots(self) -> Set[int]:
        """Slots the engine consumes now."""
        ...

    async def acquire(self, slots: Collection[int]) -> None:
        """Restore state and the dedup window of `slots`, then consume them from committed offsets."""
        ...

    async def release(self, slots: Collection[int]) -> None:
        """Stop fetching `slots`, finish in-flight work, commit outputs, state and offsets."""
        ...

    async def prefetch(self, slots: Collection[int]) -> bool:
        """Read ahead the logs a later `acquire(slots)` needs; return whether it succeeded."""
        ...

    def use_slot_count(self, slot_count: int) -> None:
        """Hold slots of a range map of `slot_count` slots (hash ranges of partitions when there
        are more slots than partitions: layout.py)."""
        ...

    def committed_positions(self) -> Mapping[int, int]:
        """Per held hash-range slot, the input offset its committed transactions count up to."""
        ...


class IdentityTaken(UserError):
    """Another process claimed this worker id after this one: this one stands down."""


class RangeMember:
    """Keeps one worker's held slots equal to what the newest publication allows it."""

    def __init__(self, engine: SlotOwner, channel: ControlChannel, worker: int,
                 heartbeat_seconds: float = 1.0, poll_seconds: float = 0.05,
                 pauses: HandoffPauses | None = None) -> None:
        self.engine = engine
        self.pauses = pauses
        """Measures the pause of each slot acquired after a transit (pauses.py); None: not measured."""
        self._transit_since: dict[int, int] = {}
        """Slot -> published_ms of the first publication that put it in transit towards this worker."""
        self.channel = channel
        self.worker = worker
        self.heartbeat_seconds = heartbeat_seconds
        self.poll_seconds = poll_seconds
        self.applied_epoch = 0
        """The newest epoch this worker has fully applied (released and acquired)."""
        self._last_report = 0.0
        self._reported_epoch = 0
        self._report_lock = asyncio.Lock()
        self._prepare_seen: Prepare | None = None
        self._warm: tuple[int, frozenset[int]] = (0, frozenset())
        """(prepare epoch, slots) of the newest finished read-ahead."""
        self._read_ahead_task: asyncio.Task[None] | None = None
        self._lost_retry = Backoff()
        """When a failed acquire of lost slots may be tried again."""
        self.instance = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        """This process's name in its reports, unique even for a worker restarted in place."""
        self.claim = -1
        """The offset of this member's first report: its claim on the worker id (-1: none yet)."""
        self.stood_down = False
        """Set when a newer process took the worker id: this member reports nothing any more."""

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the control topic until `stop` is set; once the engine stopped, `report_final`
        says it holds nothing."""
        await asyncio.to_thread(self.channel.catch_up)
        try:
            while not stop.is_set():
                try:
                    await self.sync_once(read=False)  # the catch-up and each wait below read to the end
                except ControlWriteFailed as exc:
                    # The control topic's partition is between leaders (a broker died, restarts or
                    # froze): retry the round. An epoch counts as applied only once its report is
                    # written, so the retry repeats what is left of it (releases and acquires are
                    # idempotent); ending the worker instead would release every slot it holds.
                    log.warning("w%d: %s; retrying", self.worker, exc)
                # Wait on the topic itself, not a timer: a new epoch is applied the moment it arrives.
                await asyncio.to_thread(self.channel.poll, self.poll_seconds)
        finally:
            if self._read_ahead_task is not None:
                self._read_ahead_task.cancel()

    async def sync_once(self, read: bool = True) -> None:
        """One round: read new control records (unless `read` is False: the caller just read them),
        apply the newest epoch, heartbeat when due."""
        if read:
            # A read is a hop to a thread and back through the event loop, which a starved worker
            # turns around only after everything queued before it.
            await asyncio.to_thread(self.channel.poll, 0.0)
        self._check_identity()
        pub = self.channel.state.publication
        if pub is None:
            return
        self.engine.use_slot_count(pub.map.slot_count)
        self._follow_prepare(pub.epoch)
        self._note_transit(pub)
        loop = asyncio.get_running_loop()
        if pub.epoch != self.applied_epoch:
            allowed = pub.allowed_slots(self.worker)
            revoked = to_release(self.engine.held_slots, allowed)
            if revoked:
                log.info("w%d epoch %d: releasing %s", self.worker, pub.epoch, format_slot_list(sorted(revoked)))
                if self.pauses is not None:
                    self.pauses.forget(revoked)
                await self.engine.release(revoked)
            granted = to_acquire(self.engine.held_slots, allowed)
            # The controller waits for this epoch's report only from the workers it awaits; a grant's
            # new owner reports once it acquired (a write before it would lengthen the pause), unless
            # that report is its first: it claims the worker id before anything is fenced.
            if revoked or not granted or self.worker in pub.awaiting or self.claim < 0:
                await self.report(pub.epoch)
                await asyncio.to_thread(self.channel.poll, 0.0)
                newest = self.channel.state.publication
                if newest is not None and newest.epoch != pub.epoch:
                    return  # a newer epoch arrived while releasing: apply that one first
            if granted:
                log.info("w%d epoch %d: acquiring %s", self.worker, pub.epoch, format_slot_list(sorted(granted)))
                self._expect_pauses(granted, pub.epoch)
                await self.engine.acquire(granted)
                await self.report(pub.epoch)
            self.applied_epoch = pub.epoch
        elif to_acquire(self.engine.held_slots, pub.allowed_slots(self.worker)) and self._lost_retry.ready():
            await self._acquire_lost(pub.epoch)
        elif loop.time() - self._last_report >= self.heartbeat_seconds:
            await self.report(self.applied_epoch)

    async def _acquire_lost(self, epoch: int) -> None:
        """Acquire again the slots of the applied epoch the engine let go by itself (their producer
        was fenced or gave up during a broker fault), if the newest publication, read to the end of
        the topic first, still gives them to this worker; a newer epoch is applied the usual way."""
        lost: frozenset[int] = frozenset()
        try:
            # The broker fault that failed the producer can fail this read of the control topic
            # (a frozen node's handle decommissioned: _DESTROY_BROKER) and the slots' restore
            # too; neither left anything behind, so both are tried again, with a growing pause.
            await asyncio.to_thread(self.channel.catch_up)
            self._check_identity()  # the producer may have failed because a newer process fenced it
            pub = self.channel.state.publication
            if pub is None or pub.epoch != epoch:
                return
            lost = to_acquire(self.engine.held_slots, pub.allowed_slots(self.worker))
            if not lost:
                return
            log.warning("w%d epoch %d: acquiring %s again: their producer failed", self.worker, epoch,
                        format_slot_list(sorted(lost)))
            await self.engine.acquire(lost)
        except (KafkaException, TransactionFailed) as exc:
            delay = self._lost_retry.failed()
            log.warning("w%d: acquiring %s again failed (%s); trying again in %.1f s", self.worker,
                        format_slot_list(sorted(lost)) if lost else "lost slots", exc, delay)
            return
        self._lost_retry.succeeded()
        await self.report(epoch)

    def _check_identity(self) -> None:
        """Stand down (IdentityTaken) if another process claimed this worker id after this one."""
        newest = self.channel.state.claims.get(self.worker)
        if self.claim < 0 or newest is None or newest.instance == self.instance or newest.claim <= self.claim:
            return
        self.stood_down = True
        raise IdentityTaken(
            f"worker {self.worker} of group {self.channel.group_id!r} was claimed by another process "
            f"({newest.instance}, pid {newest.pid}) after this one ({self.instance}); this one stops. Run one process "
            "per worker id: a pod force-deleted while still running, or a second `keyrange worker --worker-id "
            f"{self.worker}`, causes this")

    def _note_transit(self, pub: Publication) -> None:
        """Remember since when each slot has been in transit towards this worker (a pause starts there)."""
        if not pub.published_ms:
            return  # written by a controller that did not stamp publications: nothing to measure from
        towards = in_transit_towards(pub.map, pub.transit, self.worker)
        for slot in list(self._transit_since):
            if slot not in pub.map.slots_of(self.worker):
                del self._transit_since[slot]  # the plan changed: the slot goes elsewhere
        for slot in towards:
            self._transit_since.setdefault(slot, pub.published_ms)

    def _expect_pauses(self, granted: Set[int], epoch: int) -> None:
        for slot in granted:
            since = self._transit_since.pop(slot, None)
            if since is not None and self.pauses is not None:
                self.pauses.expect(slot, since, epoch)

    def _follow_prepare(self, epoch: int) -> None:
        """Start reading ahead the slots a newly announced handoff from `epoch` will grant us."""
        prepare = self.channel.state.prepare
        if prepare is None or prepare.epoch != epoch or prepare == self._prepare_seen:
            return
        self._prepare_seen = prepare
        slots = prepare.slots_for(self.worker) - set(self.engine.held_slots)
        if slots:
            if self._read_ahead_task is not None:
                self._read_ahead_task.cancel()
            log.info("w%d: reading ahead %s for the handoff from epoch %d", self.worker,
                     format_slot_list(sorted(slots)), epoch)
            self._read_ahead_task = asyncio.create_task(self._read_ahead(prepare.epoch, frozenset(slots)))

    async def _read_ahead(self, epoch: int, slots: frozenset[int]) -> None:
        began = asyncio.get_running_loop().time()
        if await self.engine.prefetch(slots):
            log.info("w%d: read ahead %s in %.0f ms", self.worker, format_slot_list(sorted(slots)),
                     (asyncio.get_running_loop().time() - began) * 1000)
            self._warm = (epoch, slots)
            try:
                await self.report(self._reported_epoch)
            except ControlWriteFailed as exc:  # the next heartbeat carries the warm slots
                log.warning("w%d: %s", self.worker, exc)

    async def report_final(self) -> None:
        """After the engine stopped: report holding what it still holds (nothing, after a clean stop),
        so a handoff waiting for this worker goes on at once. A failure is logged with its cause and
        not raised: the worker is stopping either way."""
        try:
            await self.report(self.applied_epoch)
        except Exception as exc:
            log.warning("w%d: the final report was not written (%s: %s); the controller still sees the "
                        "slots of this worker's last report as held", self.worker, type(exc).__name__, exc,
                        exc_info=not isinstance(exc, (ControlWriteFailed, KafkaException)))

    async def report(self, epoch: int) -> None:
        """Write this worker's report: `epoch` applied (or a newer one reported before), the slots
        the engine holds now, the slots read ahead."""
        async with self._report_lock:  # a read-ahead reports too: never let a report go back an epoch
            if self.stood_down:
                return  # the worker id is another process's now: its reports must stand
            self._reported_epoch = max(self._reported_epoch, epoch)
            self._last_report = asyncio.get_running_loop().time()
            warm_epoch, warm = self._warm
            state = self.channel.state
            report = WorkerReport(self.worker, self._reported_epoch, frozenset(self.engine.held_slots), now_ms(),
                                  os.getpid(), warm, warm_epoch, self.pauses.last if self.pauses else None,
                                  self.instance, self.claim, dict(self.engine.committed_positions()),
                                  state.prepare.epoch if state.prepare is not None else 0, state.read_to)
            offset = await asyncio.to_thread(self.channel.report, report)
            if self.claim < 0:
                self.claim = offset


def ordinal_from_hostname(hostname: str) -> int:
    """The StatefulSet ordinal in a pod's hostname (`payments-3` -> 3); ValueError if there is none."""
    _, _, tail = hostname.rpartition("-")
    if not tail.isdigit():
        raise ValueError(
            f"cannot take a worker id from hostname {hostname!r}: expected <name>-<ordinal>, as a StatefulSet's "
            "pods are named"
        )
    return int(tail)
