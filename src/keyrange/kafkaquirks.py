"""Kafka client and broker quirks, in one place: what a failed call means, how long to wait before
trying again, and the named workarounds for the embedded broker (tansu).

Every caller of a Kafka client asks `classify` (after `kafka_error`, which unwraps confluent-kafka's
SystemError) rather than matching error codes itself, and waits between tries with `Backoff`; a
slot's transaction that cannot commit raises `TransactionFailed` (the worker's slot producers raise
it, the range member and the engine catch it). A
tansu workaround is a function here whose name says what it does and whose docstring says why in
one line; docs/kafka.md ("Client and broker quirks") keeps the history and the measurements.
Callers: worker/transactions.py, worker/consumer.py, worker/engine.py, worker/logreader.py,
ranges/channel.py, ranges/member.py, kafkaio.py, operator/clusterassigner.py.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException

FIRST_RETRY_SECONDS = 0.5
"""The wait after a first failure, unless a caller says otherwise."""
LONGEST_RETRY_SECONDS = 30.0
"""The longest wait between two tries while Kafka is away."""


class Failure(enum.Enum):
    """What a failed Kafka call means for whoever made it."""

    FENCED = "fenced"
    """Another producer initialised the transactional id (or the broker says this producer's epoch is
    gone): this producer can neither commit nor abort again; whoever holds the id now wins."""
    CONFLICT = "conflict"
    """librdkafka still runs an earlier transactional call (one that timed out) and refuses any other
    until it ends; if the broker fenced the producer meanwhile it never does."""
    FATAL = "fatal"
    """The client is unusable; only a new one can go on."""
    ABORTABLE = "abortable"
    """The open transaction must be aborted; then the same work may be tried again."""
    RETRIABLE = "retriable"
    """The same call may simply be made again (a timeout, a coordinator moving)."""
    OTHER = "other"
    """None of the above flags: the call failed, and what follows is the caller's choice."""


class TransactionFailed(RuntimeError):
    """A slot's producer hit a fatal error, e.g. fenced because another worker acquired the slot,
    or gave up retrying (worker/transactions.py `CommitRetry`): the slot's transaction did not commit."""

    def __init__(self, message: str, gave_up: bool = False) -> None:
        super().__init__(message)
        self.gave_up = gave_up
        """This worker gave the producer up (stuck, or no commit within COMMIT_DEADLINE_SECONDS, or
        stopping); False: Kafka failed it (fenced by another producer of the slot, ...), which only
        whoever assigns slots may overrule."""


_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})
# tansu answers a fenced producer with these flagged only abortable, where Kafka flags them fatal.


def classify(error: KafkaError) -> Failure:
    """What `error` means: fenced by its code whatever its flags, then librdkafka's flags (a
    transaction that needs an abort is not helped by trying the same call again)."""
    code = error.code()
    if code in _FENCED_CODES or (code == KafkaError.INVALID_PRODUCER_EPOCH and error.fatal()):
        return Failure.FENCED
    if code == KafkaError._CONFLICT:
        return Failure.CONFLICT
    if error.fatal():
        return Failure.FATAL
    if error.txn_requires_abort():
        return Failure.ABORTABLE
    if error.retriable():
        return Failure.RETRIABLE
    return Failure.OTHER


def slow_or_away(error: KafkaError) -> bool:
    """Whether a failed read means Kafka is slow or away, so the same read may be made again: a
    timeout (librdkafka does not flag an admin request's timeout retriable) or a retriable error."""
    return error.code() == KafkaError._TIMED_OUT or classify(error) is Failure.RETRIABLE


def kafka_error(exc: KafkaException | SystemError) -> KafkaError:
    """The KafkaError a client call failed with; `exc` itself is raised again if it carries none.

    confluent-kafka can raise SystemError, with the call's KafkaException as its cause, when its
    `logger` callback ran while that exception was pending (docs/kafka.md)."""
    cause = exc if isinstance(exc, KafkaException) else exc.__cause__
    if isinstance(cause, KafkaException) and isinstance(cause.args[0], KafkaError):
        return cause.args[0]
    raise exc


class Backoff:
    """Waits between tries of something that fails while Kafka is away: `first_seconds` after the
    first failure, doubling with each failure in a row up to `longest_seconds`; a success starts
    over. Callers wait as suits them (a thread's Event, asyncio, or `ready()` polled by a loop);
    the clock is injected so that tests need not wait."""

    def __init__(self, first_seconds: float = FIRST_RETRY_SECONDS, longest_seconds: float = LONGEST_RETRY_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if first_seconds <= 0 or longest_seconds <= 0:
            raise ValueError(f"a backoff's waits must be positive, not {first_seconds} and {longest_seconds}")
        self._first, self._longest, self._clock = first_seconds, longest_seconds, clock
        self.failures = 0
        """Failures in a row since the last success."""
        self._retry_at = float("-inf")

    @property
    def delay(self) -> float:
        """The wait the next failure brings."""
        return min(self._first * 2.0 ** min(self.failures, 64), self._longest)

    def failed(self) -> float:
        """Count a failure; return how long to wait before the next try (`ready` says when it is over)."""
        delay = self.delay
        self.failures += 1
        self._retry_at = self._clock() + delay
        return delay

    def ready(self) -> bool:
        """True when no wait is due."""
        return self._clock() >= self._retry_at

    def succeeded(self) -> None:
        """A try succeeded: the next one may come at once, and a next failure waits `first_seconds`."""
        self.failures, self._retry_at = 0, float("-inf")


# --- tansu workarounds (each right on Apache Kafka too; docs/kafka.md says what tansu does) -------


WHOLE_LOG_FROM = 0
"""Where a read of a partition from its start begins: offset 0, not the earliest offset ListOffsets
lists, which tansu can answer past a fresh partition's first batches when several producers write
them at once; a read below the log's start begins at that start (`auto.offset.reset`). A position
(where a slot resumes) is the listed one unless records below it read back (`LogReader.start_offsets`):
on Kafka a log whose head was deleted starts past 0."""


def outputs_acknowledged_before_offsets(flush: Callable[[], None], send_offsets: Callable[[], None]) -> None:
    """Flush a transaction's outputs, then send its offsets: tansu's init_transactions commits what a
    dead predecessor had delivered, so visible offsets must imply visible outputs."""
    flush()
    send_offsets()


def known_log_end(fetched_end: int, listed_end: int) -> int:
    """A partition's end from a fetch response's high watermark and a ListOffsets answer: both are
    lower bounds (tansu's ListOffsets answers too low after a batched produce), so the larger."""
    return max(fetched_end, listed_end)


def read_past_listed_end(poll: Callable[[float], object]) -> None:
    """One more short read once a read reached the ListOffsets end: tansu's can be too low right
    after a write (on Kafka this finds nothing, once)."""
    poll(0.1)


def listed_topic_config(configs: Mapping[str, Any], name: str) -> str | None:
    """A topic config's value from DescribeConfigs; None when it is not listed (tansu lists only the
    configs a topic was created with; Kafka lists every one)."""
    entry = configs.get(name)
    return None if entry is None else str(entry.value)


PATIENT_FETCH_WAIT_MS = 200
"""The fetch wait of a restore reader whose broker withheld records (`withholds_records_below_end`):
tansu takes it to list a partition's batches, tens of milliseconds for tens of thousands of them
on a busy machine."""


def withholds_records_below_end(position: int, listed_end: int) -> bool:
    """Whether a read at `position` that got no records for a while was answered without records
    the broker has (`listed_end`: its read_committed ListOffsets end, so an open transaction does not
    count): tansu answers a fetch with none when it cannot list the partition's batches within
    the fetch's wait (Kafka answers with what it has at once)."""
    return listed_end > position


TRANSACTION_END_LOCKS = 1024
"""How many lock files `transaction_end_lock` spreads partitions over (a bounded set in the temp
directory; two partitions that share one only take turns they need not take)."""


def transaction_end_lock(bootstrap: str, topic: str, partition: int | None) -> Path:
    """The host-wide lock file that `transactions_end_one_at_a_time` takes for the producers writing
    `partition` of `topic` (None: any of its partitions) on the brokers at `bootstrap`."""
    key = f"{bootstrap}\0{topic}\0{'all' if partition is None else partition}".encode()
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % TRANSACTION_END_LOCKS
    return Path(tempfile.gettempdir()) / "keyrange-transaction-ends" / f"{bucket}.lock"


@contextlib.contextmanager
def transactions_end_one_at_a_time(lock: Path | None, wait_seconds: float,
                                   clock: Callable[[], float] = time.monotonic) -> Iterator[bool]:
    """Hold `lock` while a transaction ends (commit, abort, or init_transactions' rollback), yielding
    whether it was taken: tansu's EndTxn that meets one of another transactional id on the same
    partition can leave that one committed yet still counted open, which stops the partition's last
    stable offset for good. Waited for `wait_seconds` at most (then the call goes ahead unlocked)."""
    if lock is None:
        yield False
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as file:
        deadline = clock() + wait_seconds
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
                break
            except BlockingIOError:
                if clock() >= deadline:
                    taken = False
                    break
                time.sleep(0.001)
        try:
            yield taken
        finally:
            if taken:
                fcntl.flock(file, fcntl.LOCK_UN)
