"""What one worker process needs to know, with units in the names and bounds checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keyrange.inputmapping import DEFAULT_MAPPING, InputMapping
from keyrange.kafkaclients import KafkaClients


@dataclass(frozen=True)
class WorkerSettings:
    """Settings of one worker; see docs/worker.md for how each one shapes behaviour."""

    bootstrap: str
    """Kafka bootstrap servers."""
    topic: str
    """The input topic."""
    group_id: str
    """Consumer group whose committed offsets the worker reads and commits (no group membership)."""
    worker_id: str = "0"
    """This worker's identity (its ordinal in the range map, in reports, logs and metrics)."""
    consumer_name: str | None = None
    """The `consumer` metric label; defaults to group_id."""
    sink_topic: str | None = None
    """Processed-record topic; defaults to `<topic>.processed`."""
    dlq_topic: str | None = None
    """Dead-letter topic; defaults to `<topic>.dlq`."""
    state_topic: str | None = None
    """Compacted keyed-state changelog; defaults to `<group_id>.state`."""
    concurrency: int = 64
    """Handler calls in flight at once across all clients (also the sync handlers' thread pool)."""
    max_pending: int = 10_000
    """Unfinished events per partition above which the partition is paused."""
    max_pending_bytes: int = 16 * 1024 * 1024
    """Bytes of unfinished events (their values) per partition above which the partition is paused:
    bounds memory when events are large, where `max_pending` alone would not."""
    ttl_seconds: float = 10.0
    """A uuid seen within this many seconds of event time (`created`) is dropped as a duplicate."""
    max_retries: int = 3
    """Handler attempts beyond the first before an event is dead-lettered."""
    handler_timeout_seconds: float = 60.0
    """A handler call that has not returned after this long fails (and is retried, then
    dead-lettered): one hung call must not block its client, its partition's commits and every
    handoff of its slot forever."""
    retry_backoff_ms: int = 50
    """Wait before the first retry; doubles per attempt, capped at 2 s."""
    commit_interval_ms: int = 100
    """How often one transaction carries finished outputs, state and offsets."""
    fetch_batch_size: int = 1000
    """Records taken from the consumer per call."""
    handler_config: dict[str, Any] = field(default_factory=dict)
    """Passed to handlers as `ctx.config`."""
    restore_clock_slack_seconds: float = 10.0
    """Extra history a restore reads, before the dedup window and before the outputs it looks for,
    to tolerate clock skew between producers, workers and the broker. Skew beyond it could let a
    duplicate through or re-run an event finished just before a handoff; more costs restore time
    (every handoff reads TTL + this much input, and this much output, per moved slot)."""
    kafka_timeout_seconds: float = 30.0
    """Timeout of a single Kafka admin, restore or transaction call."""
    client_properties: Mapping[str, str] = field(default_factory=dict)
    """The user's Kafka client properties (TLS, SASL, ...), for every client the worker makes."""
    replication_factor: int | None = None
    """Replication factor of the topics the worker creates; None: the broker's default."""
    input_mapping: InputMapping = DEFAULT_MAPPING
    """Where each record's clientId, uuid and event time are, and how its value is decoded (`spec.input`)."""

    def __post_init__(self) -> None:
        checks = [
            (self.concurrency >= 1, f"concurrency must be at least 1, got {self.concurrency}"),
            (self.max_pending >= 1, f"max_pending must be at least 1, got {self.max_pending}"),
            (self.max_pending_bytes >= 1024,
             f"max_pending_bytes must be at least 1024, got {self.max_pending_bytes}"),
            (self.handler_timeout_seconds > 0,
             f"handler_timeout_seconds must be positive, got {self.handler_timeout_seconds}"),
            (self.ttl_seconds > 0, f"ttl_seconds must be positive, got {self.ttl_seconds}"),
            (self.max_retries >= 0, f"max_retries must be 0 or more, got {self.max_retries}"),
            (self.commit_interval_ms >= 1, f"commit_interval_ms must be at least 1, got {self.commit_interval_ms}"),
            (self.fetch_batch_size >= 1, f"fetch_batch_size must be at least 1, got {self.fetch_batch_size}"),
            (bool(self.topic), "topic must not be empty"),
            (bool(self.group_id), "group_id must not be empty"),
            (bool(self.worker_id), "worker_id must not be empty"),
            (self.replication_factor is None or self.replication_factor >= 1,
             f"replication_factor must be at least 1, got {self.replication_factor}"),
            (self.topic not in (self.sink, self.dlq),
             f"the sink and dead-letter topics must differ from the input topic {self.topic!r} "
             "(outputs written to the input would be consumed again)"),
            (self.sink != self.dlq, f"the sink and dead-letter topics must differ (both are {self.sink!r})"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def clients(self) -> KafkaClients:
        """Builds the worker's Kafka client configurations."""
        return KafkaClients(self.bootstrap, self.client_properties)

    @property
    def sink(self) -> str:
        """The processed-record topic after defaults."""
        return self.sink_topic or f"{self.topic}.processed"

    @property
    def dlq(self) -> str:
        """The dead-letter topic after defaults."""
        return self.dlq_topic or f"{self.topic}.dlq"

    @property
    def state(self) -> str:
        """The keyed-state changelog topic after defaults."""
        return self.state_topic or f"{self.group_id}.state"

    def slot_transactional_id(self, slot: int) -> str:
        """One transactional producer per slot: whoever acquires the slot fences its earlier owners."""
        return f"keyrange-{self.group_id}-slot-{slot}"

    @property
    def metrics_consumer(self) -> str:
        """The `consumer` label value."""
        return self.consumer_name or self.group_id
