"""The StreamConsumer resource: one YAML shape for the cluster and for `keyrange run -f`.

Field names are a contract (docs/design.md, "The StreamConsumer"). The model is the single parser for both paths: the
operator validates `spec` with it, `keyrange run` validates the whole document with it, and both
turn pydantic's errors into one readable line per problem (`SpecError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from keyrange.aggregation.processed_stream import DEFAULT_TRIGGER_SECONDS
from keyrange.aggregation.retention import DEFAULT_MINUTES as DEFAULT_RETENTION_MINUTES
from keyrange.errors import UserError
from keyrange.inputmapping import (
    CLIENT_ID_PATTERN,
    CREATED_PATTERN,
    DEFAULT_CLIENT_ID,
    DEFAULT_CREATED,
    DEFAULT_FORMAT,
    DEFAULT_UUID,
    FORMAT_PATTERN,
    UUID_PATTERN,
    InputMapping,
)
from keyrange.kafkaclients import RESERVED_PROPERTIES
from keyrange.podfields import (
    DNS_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    EnvFromSource,
    EnvVar,
    PullSecretRef,
    Toleration,
)

API_VERSION = "keyrange.dev/v1alpha1"
KIND = "StreamConsumer"


SPARK_MEMORY_PATTERN = r"^[0-9]+[kKmMgGtT]?[bB]?$"
"""Spark's memory syntax (`spark.executor.memory`); the CRD carries the same pattern."""
TOPIC_NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
HANDLER_PATTERN = r"^(sleep|ledger|noop|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

PATTERN_MEANINGS: Mapping[str, str] = {
    TOPIC_NAME_PATTERN: "a Kafka topic name (letters, digits, '.', '_' and '-')",
    HANDLER_PATTERN: "a handler: sleep, ledger, noop, or module:function of your own (e.g. mypkg.handlers:handle)",
    NAME_PATTERN: "a Kubernetes name (lower-case letters, digits and '-', starting and ending with a letter or digit)",
    CLIENT_ID_PATTERN: "a clientId mapping: key, field:<name> (dotted for a nested field) or header:<name>",
    UUID_PATTERN: "a uuid mapping: field:<name>, header:<name> or none",
    CREATED_PATTERN: "a created mapping: field:<name> or timestamp",
    FORMAT_PATTERN: "a format: json, raw, or module:function of a decoder of your own",
    SPARK_MEMORY_PATTERN: "a JVM memory size such as 512m or 2g",
    ENV_NAME_PATTERN: "an environment variable name (letters, digits and '_', not starting with a digit)",
    DNS_SUBDOMAIN_PATTERN: "a Kubernetes object name (lower-case letters, digits, '-' and '.')",
}
"""What each field pattern means, said in a spec error instead of the regular expression."""


class SpecError(UserError, ValueError):
    """A StreamConsumer is invalid; the message lists every problem and where it is."""


class _Model(BaseModel):
    # strict: "10" is not 10 here, exactly as the CRD's schema rejects it in a cluster, so one YAML
    # means the same thing to `kubectl apply` and to `keyrange run`.
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True, strict=True)


def default_env_name(client_property: str) -> str:
    """The environment variable a secret client property is read from by default
    (`sasl.password` -> `KEYRANGE_KAFKA_SASL_PASSWORD`)."""
    return "KEYRANGE_KAFKA_" + re.sub(r"[^A-Za-z0-9]", "_", client_property).upper()


class SecretKeyRef(_Model):
    """One key of a Kubernetes Secret in the StreamConsumer's namespace."""

    name: str = Field(min_length=1, max_length=253)
    key: str = Field(min_length=1, max_length=253)


class ClientPropertyFrom(_Model):
    """A client property whose value is a secret: it is read from an environment variable, which
    in a cluster the operator fills from `secretKeyRef`."""

    name: str = Field(min_length=1)
    """The librdkafka property, e.g. `sasl.password` or `ssl.key.pem`."""
    secret_key_ref: SecretKeyRef | None = Field(default=None, alias="secretKeyRef")
    """Where the value is in a cluster (required there)."""
    env: str | None = Field(default=None, pattern=ENV_NAME_PATTERN)
    """The environment variable holding the value; default `KEYRANGE_KAFKA_<PROPERTY>`."""

    @property
    def env_name(self) -> str:
        """The environment variable after defaults."""
        return self.env or default_env_name(self.name)


class KafkaSpec(_Model):
    """Where the input topic lives, and how to connect to Kafka."""

    bootstrap_servers: str | None = Field(default=None, alias="bootstrapServers")
    """Kafka bootstrap servers; empty means the embedded broker (`keyrange run` only)."""
    topic: str = Field(min_length=1, max_length=249, pattern=TOPIC_NAME_PATTERN)
    """The input topic."""
    group_id: str | None = Field(default=None, alias="groupId")
    """Consumer group for committed offsets; defaults to metadata.name."""
    partitions: int = Field(default=12, ge=1, le=10_000)
    """Partitions to create the input topic with when it does not exist (`keyrange run`)."""
    replication_factor: int | None = Field(default=None, ge=1, le=100, alias="replicationFactor")
    """Replication factor of the topics keyrange creates; default: the brokers' default.replication.factor."""
    client_properties: dict[str, str] = Field(default_factory=dict, alias="clientProperties")
    """librdkafka client properties for every Kafka client keyrange makes (TLS, SASL, timeouts, ...)."""
    client_properties_from: list[ClientPropertyFrom] = Field(default_factory=list, alias="clientPropertiesFrom")
    """Client properties whose values are secrets (from environment variables, or Secrets in a cluster)."""

    @model_validator(mode="after")
    def _properties_are_ours_to_give(self) -> KafkaSpec:
        names = [*self.client_properties, *(p.name for p in self.client_properties_from)]
        reserved = [f"{n} ({RESERVED_PROPERTIES[n]})" for n in names if n in RESERVED_PROPERTIES]
        if reserved:
            raise ValueError(f"client properties may not set {'; '.join(reserved)}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"client properties set more than once: {', '.join(twice)}")
        return self

    def resolved_client_properties(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`clientProperties` plus each `clientPropertiesFrom` value read from `environ`."""
        resolved = dict(self.client_properties)
        for index, item in enumerate(self.client_properties_from):
            value = environ.get(item.env_name)
            if value is None:
                where = (f"; in a cluster the operator sets it from Secret {item.secret_key_ref.name!r} key "
                         f"{item.secret_key_ref.key!r}" if item.secret_key_ref else "")
                raise SpecError(
                    f"spec.kafka.clientPropertiesFrom[{index}]: {item.name} is read from the environment "
                    f"variable {item.env_name}, which is not set: export it{where}")
            resolved[item.name] = value
        return resolved


class DedupSpec(_Model):
    """Duplicate suppression by event uuid."""

    ttl_seconds: float = Field(default=10.0, gt=0, le=86_400, alias="ttlSeconds")
    """A uuid seen within this many seconds is dropped and counted."""


class InputSpec(_Model):
    """Where each record's clientId, uuid and event time are, and how its value is decoded
    (docs/input.md); the defaults are the wire contract of docs/design.md."""

    client_id: str = Field(default=DEFAULT_CLIENT_ID, alias="clientId", pattern=CLIENT_ID_PATTERN)
    """`key` (the record key), `field:<name>` (of the JSON value, dotted for nested) or `header:<name>`."""
    uuid: str = Field(default=DEFAULT_UUID, pattern=UUID_PATTERN)
    """`field:<name>`, `header:<name>`, or `none` (no deduplication)."""
    created: str = Field(default=DEFAULT_CREATED, pattern=CREATED_PATTERN)
    """`field:<name>` (epoch ms) or `timestamp` (the record's)."""
    format: str = Field(default=DEFAULT_FORMAT, pattern=FORMAT_PATTERN)
    """`json`, `raw` (the handler gets the value's bytes) or `module:function` (a decoder from bytes to a dict)."""

    @model_validator(mode="after")
    def _consistent(self) -> InputSpec:
        self.mapping()
        return self

    def mapping(self) -> InputMapping:
        """The worker's InputMapping (ValueError when the mappings do not fit the format)."""
        return InputMapping(self.client_id, self.uuid, self.created, self.format)


class WorkersSpec(_Model):
    """Bounds on the number of worker processes (pods)."""

    min: int = Field(default=1, ge=1, le=1_000)
    """Never fewer workers than this."""
    max: int = Field(default=6, ge=1, le=1_000)
    """Never more workers than this. With fewer partitions than this, each partition's clients are
    cut into hash ranges so that every worker can own one (docs/ranges.md)."""
    replicas: int | None = Field(default=None, ge=1, le=1_000)
    """A fixed worker count (set by `kubectl scale` or an HPA); unset lets the planner decide."""

    @model_validator(mode="after")
    def _min_below_max(self) -> WorkersSpec:
        if self.min > self.max:
            raise ValueError(f"workers.min ({self.min}) must not exceed workers.max ({self.max})")
        if self.replicas is not None and not self.min <= self.replicas <= self.max:
            raise ValueError(
                f"workers.replicas ({self.replicas}) must be between workers.min ({self.min}) "
                f"and workers.max ({self.max})"
            )
        return self


class ScalingSpec(_Model):
    """When to split ranges over more workers and merge them back."""

    lag_high_records: int = Field(default=5_000, ge=1, alias="lagHighRecords")
    """Split a range whose lag exceeds this many records."""
    lag_high_seconds: float = Field(default=5.0, gt=0, alias="lagHighSeconds")
    """... or whose oldest unfinished event is older than this."""
    lag_low_records: int = Field(default=100, ge=0, alias="lagLowRecords")
    """Merge adjacent ranges whose lag stays below this ..."""
    cooldown_seconds: float = Field(default=60.0, ge=0, alias="cooldownSeconds")
    """... for this long; also the minimum time between two rescales of one consumer (`target`: the
    stabilization window a smaller size must keep headroom for before a merge)."""
    policy: Literal["target", "step"] = "target"
    """`target`: size to the measured rate and backlog in one decision; `step`: one split or merge per
    cooldown, on lag thresholds alone (the earlier planner, kept for comparison)."""

    @model_validator(mode="after")
    def _low_below_high(self) -> ScalingSpec:
        if self.lag_low_records >= self.lag_high_records:
            raise ValueError(
                f"scaling.lagLowRecords ({self.lag_low_records}) must be below "
                f"scaling.lagHighRecords ({self.lag_high_records})"
            )
        return self


class SinkSpec(_Model):
    """Where processed records go."""

    topic: str | None = Field(default=None, pattern=TOPIC_NAME_PATTERN)
    """Processed-record topic; defaults to `<topic>.processed`."""


class ResourcesSpec(_Model):
    """Kubernetes resource requests and limits for each worker pod."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)


class AggregationSpec(_Model):
    """The Spark job that aggregates processed records (see docs/aggregation.md)."""

    enabled: bool = False
    """Run the aggregation job for this consumer."""
    mode: Literal["continuous", "schedule"] = "continuous"
    """`continuous`: a streaming job; `schedule`: a batch run on `schedule`."""
    schedule: str | None = None
    """Cron schedule for `mode: schedule`."""
    output: str = "/data/keyrange-aggregates"
    """Where the Parquet aggregates are written (a path or an object-store URL)."""
    checkpoint: str | None = None
    """Streaming checkpoint location; defaults to `<output>/_checkpoint`."""
    executors: int = Field(default=1, ge=1, le=1_000)
    """Spark executor count on Kubernetes."""
    executor_memory: str = Field(default="1g", alias="executorMemory", pattern=SPARK_MEMORY_PATTERN)
    """Memory per Spark executor, in Spark's units (`512m`, `2g`; not Kubernetes' `2Gi`)."""
    driver_memory: str = Field(default="1g", alias="driverMemory", pattern=SPARK_MEMORY_PATTERN)
    """Memory of the Spark driver, in Spark's units."""
    trigger_seconds: float = Field(default=DEFAULT_TRIGGER_SECONDS, gt=0, le=3_600, alias="triggerSeconds")
    """`mode: continuous`: a micro-batch every this many seconds (shorter: fresher aggregates,
    a busier driver)."""
    retention_minutes: int = Field(default=DEFAULT_RETENTION_MINUTES, ge=0, le=525_600, alias="retentionMinutes")
    """How long, in event time, the stored records are kept to deduplicate against; 0 keeps them
    forever (docs/aggregation.md, "Retention")."""

    @model_validator(mode="after")
    def _schedule_needs_cron(self) -> AggregationSpec:
        if self.mode == "schedule" and not self.schedule:
            raise ValueError("aggregation.schedule is required when aggregation.mode is 'schedule'")
        return self


class StreamConsumerSpec(_Model):
    """`spec` of a StreamConsumer."""

    kafka: KafkaSpec
    handler: str = Field(default="sleep", pattern=HANDLER_PATTERN)
    """`sleep`, `ledger`, `noop`, or `module:function` of a user handler."""
    handler_config: dict[str, Any] = Field(default_factory=dict, alias="handlerConfig")
    """Passed to the handler factory (`sleep`: meanMs, stddevMs; `ledger`: delayMs)."""
    input: InputSpec = Field(default_factory=InputSpec)
    dedup: DedupSpec = Field(default_factory=DedupSpec)
    concurrency: int = Field(default=64, ge=1, le=100_000)
    """Handler calls in flight per worker."""
    max_pending: int = Field(default=10_000, ge=1, le=10_000_000, alias="maxPending")
    """Unfinished events per partition before that partition pauses."""
    max_retries: int = Field(default=3, ge=0, le=100, alias="maxRetries")
    """Handler attempts beyond the first before an event is dead-lettered."""
    max_pending_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1 << 40, alias="maxPendingBytes")
    """Bytes of unfinished events per partition before that partition pauses."""
    handler_timeout_seconds: float = Field(default=60.0, gt=0, le=86_400, alias="handlerTimeoutSeconds")
    """A handler call still running after this long fails (retried, then dead-lettered)."""
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    sink: SinkSpec = Field(default_factory=SinkSpec)
    dead_letter_topic: str | None = Field(default=None, alias="deadLetterTopic", pattern=TOPIC_NAME_PATTERN)
    """Dead-letter topic; defaults to `<topic>.dlq`."""
    image: str | None = None
    """Worker image in a cluster; defaults to the operator's own image."""
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    aggregation: AggregationSpec = Field(default_factory=AggregationSpec)
    suspend: bool = False
    """Scale to zero workers (each releases its ranges and commits on the way out); false resumes."""
    # The worker pod's fields (cluster only; podfields.py): named and shaped as in a Pod.
    env: list[EnvVar] = Field(default_factory=list)
    """Extra environment variables of the worker container (e.g. a handler's secrets, by secretKeyRef)."""
    env_from: list[EnvFromSource] = Field(default_factory=list, alias="envFrom")
    """ConfigMaps and Secrets whose keys become environment variables of the worker container."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(default=None,
                                                                                 alias="imagePullPolicy")
    """Pull policy of the worker image; default the operator's (the chart's image.pullPolicy)."""
    image_pull_secrets: list[PullSecretRef] = Field(default_factory=list, alias="imagePullSecrets")
    """Secrets for pulling the worker image, besides the chart's imagePullSecrets."""
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    """Run the workers only on nodes with these labels; replaces the chart's workers.nodeSelector."""
    affinity: dict[str, Any] = Field(default_factory=dict)
    """Node and pod (anti-)affinity of the workers; replaces the chart's workers.affinity."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the workers tolerate; replaces the chart's workers.tolerations."""
    topology_spread_constraints: list[dict[str, Any]] = Field(default_factory=list,
                                                              alias="topologySpreadConstraints")
    """How the workers spread over nodes and zones (a constraint without labelSelector selects this
    consumer's workers); replaces the chart's. None anywhere: a soft spread over nodes and zones."""
    priority_class_name: str | None = Field(default=None, alias="priorityClassName", max_length=253,
                                            pattern=DNS_SUBDOMAIN_PATTERN)
    """PriorityClass of the worker pods; default the chart's workers.priorityClassName."""

    @model_validator(mode="after")
    def _outputs_apart_from_the_input(self) -> StreamConsumerSpec:
        topic, sink, dlq = self.kafka.topic, self.sink_topic, self.dlq_topic
        if topic in (sink, dlq):
            which = "sink.topic" if sink == topic else "deadLetterTopic"
            raise ValueError(f"{which} is {topic!r}, the input topic: outputs written to the input would be "
                             "consumed again (dead letters would loop); choose another topic")
        if sink == dlq:
            raise ValueError(f"sink.topic and deadLetterTopic are both {sink!r}: processed records and dead "
                             "letters are read back separately; give them different topics")
        return self

    @property
    def sink_topic(self) -> str:
        """The processed-record topic after defaults."""
        return self.sink.topic or f"{self.kafka.topic}.processed"

    @property
    def dlq_topic(self) -> str:
        """The dead-letter topic after defaults."""
        return self.dead_letter_topic or f"{self.kafka.topic}.dlq"

    def group_id(self, name: str, namespace: str | None = None) -> str:
        """The consumer group after defaults: `<namespace>.<name>` in a cluster, so consumers of
        the same name in two namespaces never share offsets, state or outputs; `name` locally."""
        if self.kafka.group_id:
            return self.kafka.group_id
        return f"{namespace}.{name}" if namespace else name


class Metadata(_Model):
    """The part of Kubernetes metadata keyrange reads."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)
    name: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN)
    namespace: str | None = None


class StreamConsumer(_Model):
    """A whole StreamConsumer document."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)
    api_version: Literal["keyrange.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["StreamConsumer"]
    metadata: Metadata
    spec: StreamConsumerSpec

    @property
    def name(self) -> str:
        """metadata.name."""
        return self.metadata.name

    @property
    def group_id(self) -> str:
        """The consumer group after defaults."""
        return self.spec.group_id(self.metadata.name, self.metadata.namespace)


def _describe(exc: ValidationError, prefix: str) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(document)"
        lines.append(f"  {prefix}{where}: {_message(err)}")
    return "\n".join(lines)


def _message(err: ErrorDetails) -> str:
    meaning = PATTERN_MEANINGS.get(str(err.get("ctx", {}).get("pattern")))
    if err["type"] == "string_pattern_mismatch" and meaning is not None:
        return f"{err['input']!r} is not {meaning}"
    return err["msg"].removeprefix("Value error, ")


def parse_spec(spec: dict[str, Any], name: str = "streamconsumer") -> StreamConsumerSpec:
    """Validate a `spec` mapping (as the operator receives it); raise SpecError on problems."""
    try:
        return StreamConsumerSpec.model_validate(spec)
    except ValidationError as exc:
        raise SpecError(f"StreamConsumer {name!r} has an invalid spec:\n{_describe(exc, 'spec.')}") from None


def parse_document(doc: Any, source: str = "<input>") -> StreamConsumer:
    """Validate a whole StreamConsumer document; raise SpecError naming `source` on problems."""
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: expected a StreamConsumer mapping, got {type(doc).__name__}")
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise SpecError(
            f"{source}: expected apiVersion: {API_VERSION} and kind: {KIND}, "
            f"got apiVersion: {doc.get('apiVersion')!r} and kind: {doc.get('kind')!r}"
        )
    try:
        return StreamConsumer.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(f"{source}: invalid StreamConsumer:\n{_describe(exc, '')}") from None


def load_file(path: str | Path) -> StreamConsumer:
    """Read and validate the single StreamConsumer in a YAML file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path} is not UTF-8 text: {_where_undecodable(data, exc)}; save the file as UTF-8") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML: {exc}") from None
    consumers = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(consumers) != 1:
        raise SpecError(f"{path}: expected exactly one StreamConsumer document, found {len(consumers)}")
    return parse_document(consumers[0], str(path))


def _where_undecodable(data: bytes, exc: UnicodeDecodeError) -> str:
    """'byte 0xe9 at offset 75 (line 3, column 21): invalid continuation byte' (column in bytes)."""
    at = exc.start
    line = data.count(b"\n", 0, at) + 1
    column = at - (data.rfind(b"\n", 0, at) + 1) + 1
    return f"byte 0x{data[at]:02x} at offset {at} (line {line}, column {column}): {exc.reason}"
