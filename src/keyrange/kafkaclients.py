"""Every Kafka client configuration keyrange makes, built in one place.

Each role (the worker's consumer and restore reader, its transactional producer, the control
channel, the load generator, admin calls, the aggregation's reader) starts from keyrange's tuning
for that role, then takes the user's client properties (`spec.kafka.clientProperties`: TLS,
SASL, timeouts, client.id, ...), then the settings keyrange's guarantees rest on, which nobody
may change. Property names are librdkafka's (confluent-kafka), as every keyrange client is one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keyrange.errors import UserError

RESERVED_PROPERTIES: Mapping[str, str] = {
    "bootstrap.servers": "give spec.kafka.bootstrapServers (or --bootstrap) instead",
    "group.id": "give spec.kafka.groupId instead",
    "transactional.id": "each worker's is derived from the group and its ordinal",
    "enable.idempotence": "keyrange's producers are idempotent",
    "isolation.level": "keyrange reads read_committed, so aborted outputs never count as handled",
    "enable.auto.commit": "offsets commit inside the workers' transactions",
    "enable.auto.offset.store": "offsets commit inside the workers' transactions",
    "partitioner": "keys must land where Java clients put them (murmur2)",
    "transaction.timeout.ms": "a crashed worker's open transaction must stop holding back its successor soon",
}
"""Client properties keyrange sets itself, with the reason a user may not."""


def check_client_properties(properties: Mapping[str, str], where: str = "client properties") -> None:
    """Raise UserError naming every reserved property in `properties` and why it is reserved."""
    taken = [f"{key} ({RESERVED_PROPERTIES[key]})" for key in properties if key in RESERVED_PROPERTIES]
    if taken:
        raise UserError(f"{where} may not set {'; '.join(taken)}")


@dataclass(frozen=True)
class KafkaClients:
    """Where Kafka is and how to talk to it; builds each role's librdkafka configuration."""

    bootstrap: str
    """Bootstrap servers."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """The user's client properties (security, timeouts, ...); none of `RESERVED_PROPERTIES`."""

    def __post_init__(self) -> None:
        check_client_properties(self.properties)

    def _build(self, tuning: Mapping[str, Any] | None, fixed: Mapping[str, Any]) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "log_level": 3, **(tuning or {}), **self.properties, **fixed}

    def admin(self) -> dict[str, Any]:
        """An AdminClient's configuration."""
        return self._build({}, {})

    def consumer(self, group_id: str, tuning: Mapping[str, Any] | None = None,
                 isolation_level: str = "read_committed") -> dict[str, Any]:
        """A consumer that assigns partitions itself and never commits on its own.

        `group_id` keys committed offsets (the workers commit in transactions); readers that
        commit nothing still need one for librdkafka. `tuning` is keyrange's for the role
        (the user's properties override it).
        """
        return self._build({"auto.offset.reset": "earliest", **(tuning or {})}, {
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": isolation_level,
        })

    def producer(self, tuning: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An idempotent producer that places keys like Java clients do (murmur2)."""
        return self._build(tuning, {"enable.idempotence": True, "partitioner": "murmur2_random"})

    def transactional_producer(self, transactional_id: str, transaction_timeout_ms: int,
                               tuning: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A worker's transactional producer."""
        return self._build(tuning, {
            "transactional.id": transactional_id,
            "transaction.timeout.ms": transaction_timeout_ms,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
        })

    def source_options(self) -> dict[str, str]:
        """Options of keyrange's Spark data source (`keyrange-kafka`): bootstrap and `kafka.`-prefixed properties."""
        return {"bootstrap": self.bootstrap, **{f"kafka.{k}": v for k, v in self.properties.items()}}
