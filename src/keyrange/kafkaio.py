"""The few Kafka admin calls keyrange makes, with errors that say what to do.

Topics are always created explicitly: a broker that auto-creates on produce (tansu always does,
Kafka by default) would otherwise silently pick a partition count the range map does not expect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewTopic

from keyrange.errors import UserError
from keyrange.kafkaclients import KafkaClients
from keyrange.kafkaquirks import LONGEST_RETRY_SECONDS, Backoff, listed_topic_config, slow_or_away

log = logging.getLogger(__name__)

USE_BROKER_DEFAULT = -1
"""CreateTopics' replication factor meaning "the broker's default.replication.factor"."""


class KafkaSetupError(UserError, RuntimeError):
    """Kafka is unreachable or a topic does not have the shape keyrange needs."""


class KafkaUnreachable(KafkaSetupError):
    """The cluster did not answer in time (it may be restarting: worth waiting for)."""


class ClientPropertiesRefused(KafkaSetupError):
    """librdkafka refused a client property (a misspelt name, a value of the wrong kind): not worth
    waiting for, unlike Kafka away."""


class StopRequested(Exception):
    """Raised by `until_reachable` when asked to stop while Kafka was still away."""


T = TypeVar("T")

FIRST_REACH_TIMEOUT_SECONDS = 5.0
"""How long the first try waits for an answer: a worker started before its brokers says so after
5 s, not after the full client timeout; each later try waits twice as long, up to that timeout
(a slow but live cluster, e.g. TLS handshakes on a busy one, still gets its full time)."""


async def until_reachable(call: Callable[[float], T], stop: asyncio.Event | None = None,
                          longest_timeout_seconds: float = 30.0, first_delay_seconds: float = 1.0) -> T:
    """`call(timeout_seconds)` (blocking, run on a thread), retried with a backoff while Kafka does
    not answer, one log line per try: a worker started before its brokers, or during their restart,
    waits for them instead of exiting. Any other setup error (a missing topic, a bad config) is
    raised at once."""
    delays = Backoff(first_delay_seconds, LONGEST_RETRY_SECONDS)
    timeouts = Backoff(min(FIRST_REACH_TIMEOUT_SECONDS, longest_timeout_seconds), longest_timeout_seconds)
    while True:
        try:
            return await asyncio.to_thread(call, timeouts.delay)
        except KafkaUnreachable as exc:
            delay = delays.failed()
            timeouts.failed()
            log.warning("%s; trying again in %.0f s", exc, delay)
            if stop is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    raise StopRequested(str(exc)) from None


@dataclass(frozen=True)
class TopicSpec:
    """A topic keyrange needs: its name, partition count and configs."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    exact_partitions: bool = False
    """True when a different existing partition count is an error (e.g. changelogs)."""


def admin_client(bootstrap: str, client_properties: Mapping[str, str] | None = None) -> AdminClient:
    """An AdminClient with keyrange's defaults and the user's client properties; ClientPropertiesRefused
    when librdkafka refuses one of them (every keyrange command makes this client first)."""
    try:
        return AdminClient(KafkaClients(bootstrap, client_properties or {}).admin())
    except KafkaException as exc:
        raise ClientPropertiesRefused(
            f"the Kafka client properties were refused: {exc.args[0].str()}; check spec.kafka.clientProperties "
            "(or --kafka-property) against librdkafka's configuration properties") from None


def partition_counts(bootstrap: str, timeout_seconds: float = 10.0,
                     client_properties: Mapping[str, str] | None = None) -> dict[str, int]:
    """Partition count of every topic, or KafkaSetupError if the cluster does not answer."""
    admin = admin_client(bootstrap, client_properties)
    try:
        metadata = admin.list_topics(timeout=timeout_seconds)
    except KafkaException as exc:
        raise KafkaUnreachable(
            f"cannot reach Kafka at {bootstrap} within {timeout_seconds:g} s ({exc.args[0]}); "
            "check kafka.bootstrapServers and that the brokers are up"
        ) from None
    return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


def ensure_topics(bootstrap: str, topics: list[TopicSpec], timeout_seconds: float = 10.0,
                  client_properties: Mapping[str, str] | None = None,
                  replication_factor: int | None = None) -> dict[str, int]:
    """Create the missing topics; return the partition count of each. Raise on a mismatch.

    Topics are created with `replication_factor`, or the broker's `default.replication.factor`
    when None. An existing topic that must be compacted but is not is an error.
    """
    existing = partition_counts(bootstrap, timeout_seconds, client_properties)
    missing = [t for t in topics if t.name not in existing]
    admin = admin_client(bootstrap, client_properties)  # must outlive the futures, or they fail with _DESTROY
    _check_compacted(admin, [t for t in topics if t.name in existing], timeout_seconds)
    if missing:
        futures = admin.create_topics(
            [NewTopic(t.name, t.partitions, replication_factor or USE_BROKER_DEFAULT, config=dict(t.config))
             for t in missing],
            operation_timeout=timeout_seconds,
            request_timeout=timeout_seconds,
        )
        wanted = {t.name: t.partitions for t in missing}
        created = {}
        for name, future in futures.items():
            try:
                future.result()
                created[name] = wanted[name]
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise KafkaSetupError(f"cannot create topic {name!r}: {exc.args[0]}") from None
        existing = _until_listed(bootstrap, set(wanted), timeout_seconds, client_properties)
    # Existing ones too: a retry after leaders that were slow to serve finds its topics created.
    _wait_until_led(admin, {t.name: existing[t.name] for t in topics if t.name in existing}, timeout_seconds)
    result: dict[str, int] = {}
    for t in topics:
        count = existing.get(t.name)
        if count is None:
            raise KafkaSetupError(f"topic {t.name!r} was created but does not appear in metadata within "
                                  f"{timeout_seconds:g} s; check the brokers' health")
        if t.exact_partitions and count != t.partitions:
            raise KafkaSetupError(
                f"topic {t.name!r} has {count} partitions but keyrange expects {t.partitions}; "
                f"delete it or recreate it with {t.partitions} partitions"
            )
        result[t.name] = count
    return result


def _until_listed(bootstrap: str, names: set[str], timeout_seconds: float,
                  client_properties: Mapping[str, str] | None) -> dict[str, int]:
    """Partition counts once every topic of `names` is in the metadata, or at `timeout_seconds`:
    CreateTopics answers when the controller has a topic, and a broker may list it a moment later."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        existing = partition_counts(bootstrap, timeout_seconds, client_properties)
        if names <= existing.keys() or time.monotonic() >= deadline:
            return existing
        time.sleep(0.05)


def _config_unread(topic: str, exc: KafkaException) -> KafkaSetupError:
    """Why a topic's configuration could not be read: a timeout or a retriable error is Kafka slow or
    away (KafkaUnreachable: `until_reachable` tries again); anything else is for the user to fix."""
    error = exc.args[0]
    message = f"cannot read the configuration of topic {topic!r}: {error}"
    if isinstance(error, KafkaError) and slow_or_away(error):
        return KafkaUnreachable(message)
    return KafkaSetupError(message)


def _check_compacted(admin: AdminClient, topics: list[TopicSpec], timeout_seconds: float) -> None:
    wanted = [t.name for t in topics if t.config.get("cleanup.policy") == "compact"]
    if not wanted:
        return
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in wanted]
    futures = admin.describe_configs(resources, request_timeout=timeout_seconds)
    for resource, future in futures.items():
        try:
            policy = listed_topic_config(future.result(), "cleanup.policy")
        except KafkaException as exc:
            raise _config_unread(resource.name, exc) from None
        # Not listed (on tansu, a topic created without it): it passes, unverified.
        if policy is not None and "compact" not in policy.split(","):
            raise KafkaSetupError(
                f"topic {resource.name!r} exists with cleanup.policy={policy}, but keyrange keeps its latest "
                "record per key there and needs cleanup.policy=compact: set it (kafka-configs.sh --alter "
                f"--entity-type topics --entity-name {resource.name} --add-config cleanup.policy=compact) "
                "or delete the topic"
            )


KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""Kafka's default `max.message.bytes` (topic) / `message.max.bytes` (broker)."""


def max_message_bytes(bootstrap: str, topics: list[str], timeout_seconds: float = 10.0,
                      client_properties: Mapping[str, str] | None = None) -> dict[str, int]:
    """Each topic's `max.message.bytes`: the largest record batch the broker accepts for it (Kafka's
    default where the broker does not list it)."""
    admin = admin_client(bootstrap, client_properties)
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in topics]
    out = dict.fromkeys(topics, KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    for resource, future in admin.describe_configs(resources, request_timeout=timeout_seconds).items():
        try:
            limit = listed_topic_config(future.result(), "max.message.bytes")
        except KafkaException as exc:
            raise _config_unread(resource.name, exc) from None
        if limit is not None and limit.isdigit():
            out[resource.name] = int(limit)
    return out


def require_topic(bootstrap: str, topic: str, timeout_seconds: float = 10.0,
                  client_properties: Mapping[str, str] | None = None) -> int:
    """Partition count of an existing topic, or KafkaSetupError saying how to create it."""
    count = partition_counts(bootstrap, timeout_seconds, client_properties).get(topic)
    if count is None:
        raise KafkaSetupError(
            f"topic {topic!r} does not exist on {bootstrap}; create it first "
            f"(e.g. `keyrange produce --topic {topic} --partitions 12`)"
        )
    return count


def _wait_until_led(admin: AdminClient, topics: Mapping[str, int], timeout_seconds: float) -> None:
    """Return once every partition of `topics` (name -> partitions) answers ListOffsets, else raise
    KafkaUnreachable (worth waiting for: `until_reachable` tries again).

    On Apache Kafka a new topic's leaders take up their partitions a moment after CreateTopics
    answers (longer on a busy machine); until then a ListOffsets, a restore's first read, fails
    with NOT_LEADER_FOR_PARTITION, which librdkafka's offsets_for_times does not retry.
    """
    pending = {TopicPartition(name, p) for name, count in topics.items() for p in range(count)}
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + timeout_seconds
    error = None
    while pending:
        futures = admin.list_offsets({tp: latest for tp in pending}, request_timeout=timeout_seconds)
        for tp, future in futures.items():
            try:
                future.result()
                pending.discard(tp)
            except KafkaException as exc:
                error = exc.args[0]
        if pending:
            if time.monotonic() > deadline:
                where = ", ".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in pending)[:5])
                raise KafkaUnreachable(f"topics' partitions are not served within {timeout_seconds:g} s ({where}: "
                                       f"{error}); their leaders may still be starting: check the brokers' health")
            time.sleep(0.05)
