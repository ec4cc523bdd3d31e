"""The control channel: a compacted, single-partition Kafka topic per consumer (`<groupId>.control`).

Like Kafka Connect's config and status topics, it needs nothing but Kafka, so it works the same
with and without Kubernetes. Three kinds of records, all JSON, keyed so compaction keeps the latest:

- key `assignment`, written only by the controller: a `Publication` = a range map (epoch,
  ranges, owners) plus the slots still `in transit` (their old owner may still hold them, so
  their new owner must not acquire them yet) and the workers whose release the controller
  awaits. A worker may hold exactly `slots_of(itself) - transit` of the newest publication
  (the rules of who may hold what are in ownership.py).
- key `prepare`, written only by the controller before a handoff: a `Prepare` (which slots will
  move to whom), so the new owners read their logs ahead while the slots still flow at their old
  owners; it changes no ownership.
- key `worker.<n>`, written by worker n: a `WorkerReport` (the newest epoch it has applied,
  the slots it holds, the slots it has read ahead, a timestamp, the newest handoff pause it
  measured, the epoch of the newest prepare it read and how far it read this topic). Written
  after every acquire/release/read-ahead and as a heartbeat.

Two-phase handoff, after a read-ahead (its phases are in handoff.py): the controller announces the
moves, waits (boundedly) until every new owner reports them read ahead, then publishes epoch E with
the moved slots in transit; each old owner releases them (commits in its transaction) and reports
epoch E; when every awaited worker has reported E without the slots, the controller publishes E+1
with the same map and nothing in transit, and only then do the new owners acquire. Slots that do
not move are never in transit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from keyrange.errors import UserError
from keyrange.kafkaclients import KafkaClients
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.kafkaquirks import WHOLE_LOG_FROM, Failure, classify, kafka_error, read_past_listed_end
from keyrange.ranges.ownership import allowed_slots, supersedes
from keyrange.ranges.pauses import HandoffPause
from keyrange.ranges.rangemap import RangeMap
from keyrange.ranges.slots import format_slot_list, parse_slot_list

log = logging.getLogger(__name__)

ASSIGNMENT_KEY = b"assignment"
PREPARE_KEY = b"prepare"
WORKER_KEY_PREFIX = "worker."
WRITE_TIMEOUT_SECONDS = 10.0
"""How long a control write waits for the broker's acknowledgement before `ControlWriteFailed`."""
CONTROL_SETUP_TIMEOUT_SECONDS = 10.0
"""How long creating or checking the control topic may wait for the brokers' answer."""


class ControlWriteFailed(RuntimeError):
    """A control record was not acknowledged in time, e.g. while the topic's partition is between
    leaders; it may still be delivered later (every record is keyed: the newest one wins)."""


def control_topic(group_id: str) -> str:
    """The control topic of a consumer group."""
    return f"{group_id}.control"


def control_topic_spec(group_id: str) -> TopicSpec:
    """How the control topic is created: one partition (a total order), compacted."""
    return TopicSpec(control_topic(group_id), 1, {"cleanup.policy": "compact"}, exact_partitions=True)


def _slots_json(slots: frozenset[int]) -> str:
    return format_slot_list(sorted(slots)) if slots else ""


def _slots_parse(text: str) -> frozenset[int]:
    return frozenset(parse_slot_list(text)) if text else frozenset()


@dataclass(frozen=True)
class Publication:
    """What the controller publishes: the map, the slots in transit, whom it waits for."""

    map: RangeMap
    transit: frozenset[int] = frozenset()
    """Slots whose new owner must wait: their old owner has not reported releasing them yet."""
    awaiting: frozenset[int] = frozenset()
    """Workers whose report of this epoch (without the transit slots) completes the handoff."""
    reason: str = ""
    """Why this map (the planner's reason)."""
    published_ms: int = 0
    """Wall-clock time of publication (epoch ms)."""

    @property
    def epoch(self) -> int:
        """The map's epoch."""
        return self.map.epoch

    def allowed_slots(self, worker: int) -> frozenset[int]:
        """The slots `worker` may hold under this publication."""
        return allowed_slots(self.map, self.transit, worker)

    def encode(self) -> bytes:
        """The record value."""
        return orjson.dumps({
            **self.map.to_json(),
            "transit": _slots_json(self.transit),
            "awaiting": sorted(self.awaiting),
            "reason": self.reason,
            "publishedAt": self.published_ms,
        })

    @classmethod
    def decode(cls, value: bytes) -> Publication:
        """Parse a record value; raise ValueError when it is malformed."""
        data = orjson.loads(value)
        return cls(RangeMap.from_json(data), _slots_parse(data.get("transit", "")),
                   frozenset(int(w) for w in data.get("awaiting", [])), str(data.get("reason", "")),
                   int(data.get("publishedAt", 0)))


@dataclass(frozen=True)
class Prepare:
    """Announced before a handoff's epoch: which slots will move to whom, so the new owners read
    their logs ahead while the old owners still handle the slots (worker/restorer.py)."""

    epoch: int
    """The epoch of the publication the moves start from (the handoff's epoch is the next one)."""
    moves: Mapping[int, frozenset[int]]
    """New owner -> the slots it will be granted."""
    at_ms: int

    def slots_for(self, worker: int) -> frozenset[int]:
        """The slots `worker` will be granted."""
        return self.moves.get(worker, frozenset())

    def encode(self) -> bytes:
        """The record value."""
        return orjson.dumps({"epoch": self.epoch, "moves": {str(w): _slots_json(s) for w, s in self.moves.items()},
                             "at": self.at_ms})

    @classmethod
    def decode(cls, value: bytes) -> Prepare:
        """Parse a record value; raise ValueError when it is malformed."""
        d = orjson.loads(value)
        return cls(int(d["epoch"]), {int(w): _slots_parse(s) for w, s in d["moves"].items()}, int(d.get("at", 0)))


@dataclass(frozen=True)
class WorkerReport:
    """What a worker reports: the newest epoch it applied, the slots it holds, the slots it has read
    ahead for the newest `Prepare`."""

    worker: int
    epoch: int
    held: frozenset[int]
    at_ms: int
    """Wall-clock time of the report (a heartbeat)."""
    pid: int = 0
    warm: frozenset[int] = frozenset()
    """Slots read ahead for the prepare of epoch `warm_epoch`."""
    warm_epoch: int = 0
    pause: HandoffPause | None = None
    """The newest handoff pause this worker measured (ranges/pauses.py), for the operator's status."""
    instance: str = ""
    """Which process wrote it (random per process): two processes may believe they are one worker."""
    claim: int = -1
    """The control-topic offset of the instance's first report, its claim on the worker id (-1: this
    record is that first report). A higher claim is a newer process: see `IdentityClaim`."""
    positions: Mapping[int, int] = field(default_factory=dict)
    """Per held hash-range slot, the input offset its last committed transaction counts up to (the
    controller commits the lowest of a partition's to the consumer group: groupoffsets.py). Empty
    for whole-partition slots, whose transactions commit the group's offset themselves."""
    prepare_epoch: int = 0
    """The epoch of the newest prepare record the worker had read when it reported (0: none, or a
    writer that does not say): a new owner that did not read ahead either never read the prepare or
    read it and did not act on it, and this tells which."""
    read_to: int = -1
    """How far the worker had read the control topic: the offset after the last record it folded
    in (-1: not said)."""

    def encode(self) -> bytes:
        """The record value."""
        data: dict[str, Any] = {"worker": self.worker, "epoch": self.epoch, "held": _slots_json(self.held),
                                "at": self.at_ms, "pid": self.pid, "warm": _slots_json(self.warm),
                                "warmEpoch": self.warm_epoch}
        if self.pause is not None:
            data["pause"] = {"epoch": self.pause.epoch, "ms": self.pause.pause_ms, "at": self.pause.at_ms}
        if self.instance:
            data["instance"], data["claim"] = self.instance, self.claim
        if self.positions:
            data["positions"] = {str(slot): offset for slot, offset in sorted(self.positions.items())}
        if self.prepare_epoch:
            data["prepareEpoch"] = self.prepare_epoch
        if self.read_to >= 0:
            data["readTo"] = self.read_to
        return orjson.dumps(data)

    @classmethod
    def decode(cls, value: bytes) -> WorkerReport:
        """Parse a record value; raise ValueError when it is malformed."""
        d = orjson.loads(value)
        p = d.get("pause")
        pause = HandoffPause(int(p["epoch"]), int(p["ms"]), int(p["at"])) if p else None
        return cls(int(d["worker"]), int(d["epoch"]), _slots_parse(d.get("held", "")), int(d.get("at", 0)),
                   int(d.get("pid", 0)), _slots_parse(d.get("warm", "")), int(d.get("warmEpoch", 0)), pause,
                   str(d.get("instance", "")), int(d.get("claim", -1)),
                   {int(slot): int(offset) for slot, offset in (d.get("positions") or {}).items()},
                   int(d.get("prepareEpoch", 0)), int(d.get("readTo", -1)))


@dataclass(frozen=True)
class IdentityClaim:
    """The newest process that claimed a worker id: the one whose first report came last in the
    topic. Offsets order the claims, not clocks, which may disagree between machines."""

    claim: int
    """The control-topic offset of that process's first report."""
    instance: str
    pid: int


@dataclass
class ControlState:
    """The latest publication and worker reports, as read so far."""

    publication: Publication | None = None
    prepare: Prepare | None = None
    reports: dict[int, WorkerReport] = field(default_factory=dict)
    claims: dict[int, IdentityClaim] = field(default_factory=dict)
    """Per worker id, the newest process claiming it (reports of writers without an instance id,
    older versions, claim nothing)."""
    read_to: int = 0
    """The offset after the last record folded in: how far this reader has read the topic."""

    def apply(self, key: bytes | None, value: bytes | None, offset: int = -1) -> None:
        """Fold one control record, read at `offset`, in (records that do not parse are ignored:
        newer writers may add kinds this version does not know)."""
        self.read_to = max(self.read_to, offset + 1)
        if key is None or value is None:
            return
        try:
            if key == ASSIGNMENT_KEY:
                pub = Publication.decode(value)
                if supersedes(pub.epoch, None if self.publication is None else self.publication.epoch):
                    self.publication = pub
            elif key == PREPARE_KEY:
                self.prepare = Prepare.decode(value)
            elif key.startswith(WORKER_KEY_PREFIX.encode()):
                report = WorkerReport.decode(value)
                self.reports[report.worker] = report
                self._note_claim(report, offset)
        except (ValueError, KeyError, TypeError):
            return

    def _note_claim(self, report: WorkerReport, offset: int) -> None:
        claim = report.claim if report.claim >= 0 else offset
        if not report.instance or claim < 0:
            return
        newest = self.claims.get(report.worker)
        if newest is None or claim > newest.claim:
            self.claims[report.worker] = IdentityClaim(claim, report.instance, report.pid)


class ControllerFenced(UserError):
    """Another controller of the same consumer group took over: this one may not write any more."""


def controller_transactional_id(group_id: str) -> str:
    """The transactional id every controller of `group_id` writes assignments with: a new
    controller's `claim_writer` fences the previous one at the broker."""
    return f"keyrange-{group_id}-controller"


class ControlChannel:
    """Reads and writes one consumer's control topic.

    Workers write their reports with an idempotent producer. A controller first claims the writer
    role (`claim_writer`): its assignment and prepare records then go through a transactional
    producer whose id is the group's, so when a second controller claims it the broker rejects
    every later write of the first, and read_committed readers (everyone) never see them.
    """

    def __init__(self, bootstrap: str, group_id: str, client_name: str = "keyrange",
                 client_properties: Mapping[str, str] | None = None,
                 make_producer: Callable[[dict[str, Any]], Producer] = Producer) -> None:
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.topic = control_topic(group_id)
        self.state = ControlState()
        clients = KafkaClients(bootstrap, client_properties or {})
        self._clients = clients
        self._client_name = client_name
        self._make_producer = make_producer
        self._writer: Producer | None = None
        self._commit_unfinished = False
        """A controller write whose commit timed out; the next write finishes it first."""
        self._producer = make_producer(clients.producer({"linger.ms": 0, "acks": "all",
                                                    "client.id": f"{client_name}-control"}))
        # A group id is required by the client but never used: offsets are not committed,
        # every reader reads the whole compacted topic from the beginning.
        self._consumer = Consumer(clients.consumer(f"{client_name}-control-reader", {"fetch.wait.max.ms": 50}))
        self._consumer.assign([TopicPartition(self.topic, 0, WHOLE_LOG_FROM)])

    @staticmethod
    def ensure_topic(bootstrap: str, group_id: str, client_properties: Mapping[str, str] | None = None,
                     replication_factor: int | None = None,
                     timeout_seconds: float = CONTROL_SETUP_TIMEOUT_SECONDS) -> None:
        """Create the control topic if it does not exist (None: the broker's default replication factor)."""
        ensure_topics(bootstrap, [control_topic_spec(group_id)], timeout_seconds, client_properties,
                      replication_factor)

    def poll(self, timeout_seconds: float = 0.0) -> int:
        """Read whatever is new, waiting up to `timeout_seconds` for the first record and returning
        as soon as one arrives; return how many records were folded into `state`.

        Handoff latency is the sum of who-sees-what-when on this topic, so waiting here (rather than
        sleeping between non-blocking reads) is what lets a release be granted, and a grant be
        acquired, within milliseconds.
        """
        # A batch consume waits for a full batch or the timeout: ask for one record first.
        batch = self._consumer.consume(1, timeout_seconds) if timeout_seconds > 0 else []
        n = self._fold(batch)
        while True:
            batch = self._consumer.consume(500, 0)
            n += self._fold(batch)
            if len(batch) < 500:
                return n

    def _fold(self, batch: list[Any]) -> int:
        n = 0
        for m in batch:
            if m.error() is None:
                self.state.apply(m.key(), m.value(), m.offset())
                n += 1
        return n

    def catch_up(self, timeout_seconds: float = 10.0) -> None:
        """Read up to the end of the topic as it is now, so decisions start from the newest epoch."""
        deadline = time.monotonic() + timeout_seconds
        _, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=timeout_seconds)
        while time.monotonic() < deadline:
            self.poll(0.1)
            positions = self._consumer.position([TopicPartition(self.topic, 0)])
            if positions[0].offset >= high or high <= 0:
                read_past_listed_end(self.poll)
                return

    def read_progress(self, timeout_seconds: float = 5.0) -> tuple[int, int]:
        """(the reader's position, the topic's end) on the control partition, for diagnosing a
        worker that does not apply an epoch: behind the end (an open transaction holds it back, or
        it does not fetch) or at the end (it read past the record)."""
        tp = TopicPartition(self.topic, 0)
        _, high = self._consumer.get_watermark_offsets(tp, timeout=timeout_seconds)
        return self._consumer.position([tp])[0].offset, high

    def claim_writer(self, timeout_seconds: float = 30.0) -> None:
        """Become the group's one controller: fences any other controller of the group (its later
        writes are rejected by the broker) and resolves a transaction it left open."""
        producer = self._make_producer(self._clients.transactional_producer(
            controller_transactional_id(self.group_id), transaction_timeout_ms=60_000,
            tuning={"linger.ms": 0, "client.id": f"{self._client_name}-controller"}))
        try:
            producer.init_transactions(timeout_seconds)
        except SystemError as exc:
            raise KafkaException(kafka_error(exc)) from exc
        self._writer = producer

    def publish(self, publication: Publication) -> None:
        """Write an assignment record (controller only) and wait until the broker has it."""
        self._write_as_controller(ASSIGNMENT_KEY, publication.encode())

    def announce(self, prepare: Prepare) -> None:
        """Write the prepare record (controller only) and wait until the broker has it."""
        self._write_as_controller(PREPARE_KEY, prepare.encode())

    def _write_as_controller(self, key: bytes, value: bytes, timeout_seconds: float | None = None) -> None:
        writer = self._writer
        if writer is None:
            raise RuntimeError("claim_writer() first: only the group's controller writes assignments")
        timeout = WRITE_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
        committing = False
        try:
            if self._commit_unfinished:
                # A commit that timed out still runs in librdkafka, which refuses any other
                # transactional call until it is called again; its record lands before this one.
                committing = True
                writer.commit_transaction(timeout)
                self._commit_unfinished = False
            committing = False
            writer.begin_transaction()
            writer.produce(self.topic, value, key)
            committing = True
            writer.commit_transaction(timeout)
        except (KafkaException, SystemError) as exc:
            error = kafka_error(exc)
            failure = classify(error)
            if failure is Failure.ABORTABLE:
                self._commit_unfinished = False
                try:
                    writer.abort_transaction(timeout)
                except (KafkaException, SystemError) as abort_exc:
                    error = kafka_error(abort_exc)  # e.g. fenced meanwhile
                    failure = classify(error)
            elif committing and failure is Failure.RETRIABLE:
                self._commit_unfinished = True
            if failure is Failure.FENCED:
                raise ControllerFenced(
                    f"another controller of consumer group {self.group_id!r} took over (the broker fenced this "
                    "one's transactional id): stopping. Run one controller per consumer: the operator's Lease "
                    "holder, or a single keyrange run"
                ) from None
            raise ControlWriteFailed(f"control record to {self.topic} not written: {error}") from exc

    def report(self, report: WorkerReport) -> int:
        """Write a worker report and wait until the broker has it; return its offset."""
        return self._write(f"{WORKER_KEY_PREFIX}{report.worker}".encode(), report.encode())

    def _write(self, key: bytes, value: bytes) -> int:
        delivered: list[tuple[Any, Any]] = []
        self._producer.produce(self.topic, value, key, on_delivery=lambda err, m: delivered.append((err, m)))
        remaining = self._producer.flush(WRITE_TIMEOUT_SECONDS)
        if remaining or not delivered or delivered[0][0] is not None:
            raise ControlWriteFailed(f"control record to {self.topic} not delivered within "
                                     f"{WRITE_TIMEOUT_SECONDS:g} s: {delivered[0][0] if delivered else 'timeout'}")
        return int(delivered[0][1].offset())

    def close(self) -> None:
        """Flush and close the clients (a producer left open keeps reconnecting, and logging that it
        cannot, after `keyrange run` has stopped the embedded broker)."""
        self._producer.flush(5.0)
        self._producer.close()
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.flush(5.0)
            except (KafkaException, SystemError) as exc:
                # A fenced writer's error can surface in any later call that serves its events: this one.
                log.info("the controller's writer closed after an error: %s", kafka_error(exc))
        self._consumer.close()


def now_ms() -> int:
    """Wall-clock epoch milliseconds (control records carry wall time for humans and status)."""
    return int(time.time() * 1000)


def describe_reports(reports: Mapping[int, WorkerReport], at_ms: int | None = None) -> str:
    """A one-line summary of worker reports, for logs: `w1@5[6-11]` is worker 1 at epoch 5 holding
    slots 6-11. With `at_ms`, each says how old it is, which tells a worker that heartbeats but has
    not applied the newest epoch from one that went silent."""
    def age(r: WorkerReport) -> str:
        return "" if at_ms is None else f" {max(at_ms - r.at_ms, 0) / 1000:.1f}s ago"
    return " ".join(f"w{w}@{r.epoch}[{_slots_json(r.held)}]{age(r)}" for w, r in sorted(reports.items()))
