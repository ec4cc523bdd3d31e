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
from pathlib import Path
from typing import Any

from keyrange.errors import UserError
from keyrange.kafkalog import librdkafka_logger

RESERVED_PROPERTIES: Mapping[str, str] = {
    "bootstrap.servers": "give spec.kafka.bootstrapServers (or --bootstrap) instead",
    "group.id": "give spec.kafka.groupId instead",
    "transactional.id": "each slot's is derived from the group and the slot (it fences earlier owners)",
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
        # librdkafka's log goes through Python logging, where repeats are summarised (kafkalog.py).
        # No re-bootstrap when every broker is away: it can leave a transactional producer waiting
        # forever on a decommissioned broker handle (docs/kafka.md); a user may still set it.
        return {"bootstrap.servers": self.bootstrap, "log_level": 3, "logger": librdkafka_logger(),
                "metadata.recovery.strategy": "none", **(tuning or {}), **self.properties, **fixed}

    def admin(self, tuning: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An AdminClient's configuration."""
        return self._build(tuning, {})

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


_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_client_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The Java Kafka client's names for librdkafka client properties (for Spark's Kafka connector).

    Names both clients share (security.protocol, sasl.mechanism, client.id, timeouts) pass through.
    The ones that differ and matter for TLS and SASL are translated: username and password
    become a JAAS login line, CA and client certificates become PEM trust and key stores. Others
    pass through unchanged: the Java client ignores names it does not know, with a warning.
    """
    props = dict(properties)
    out: dict[str, str] = {}
    username, password = props.pop("sasl.username", None), props.pop("sasl.password", None)
    if username is not None and password is not None:
        mechanism = props.get("sasl.mechanism", "PLAIN").upper()
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise UserError(f"sasl.username/sasl.password cannot be given to Java clients for sasl.mechanism "
                            f"{mechanism}: give them sasl.jaas.config instead")
        out["sasl.jaas.config"] = (f"{module} required username={_jaas_quoted(username)} "
                                   f"password={_jaas_quoted(password)};")
    ca_file, ca_pem = props.pop("ssl.ca.location", None), props.pop("ssl.ca.pem", None)
    if ca_file is not None or ca_pem is not None:
        out["ssl.truststore.type"] = "PEM"
        if ca_pem is not None:
            out["ssl.truststore.certificates"] = ca_pem
        else:
            out["ssl.truststore.location"] = str(ca_file)
    certificate = props.pop("ssl.certificate.pem", None)
    key = props.pop("ssl.key.pem", None)
    certificate_file, key_file = props.pop("ssl.certificate.location", None), props.pop("ssl.key.location", None)
    if certificate is None and certificate_file is not None:
        certificate = Path(certificate_file).read_text(encoding="utf-8")
    if key is None and key_file is not None:
        key = Path(key_file).read_text(encoding="utf-8")
    if certificate is not None and key is not None:
        out.update({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": certificate,
                    "ssl.keystore.key": key})
    if props.get("ssl.endpoint.identification.algorithm") == "none":
        props["ssl.endpoint.identification.algorithm"] = ""
    return {**props, **out}
