"""One factory for every Kafka client configuration: keyrange's tuning, then the user's client
properties, then what the guarantees rest on; reserved properties are refused with the reason."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from keyrange.commands.kafkaargs import add_kafka_arguments, kafka_properties
from keyrange.errors import UserError
from keyrange.kafkaclients import KafkaClients, java_client_properties

SECURE = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "fetch.wait.max.ms": "5"}


def test_user_properties_override_tuning_but_not_the_guarantees() -> None:
    clients = KafkaClients("b:9092", SECURE)
    consumer = clients.consumer("g", {"fetch.wait.max.ms": 20})
    assert consumer["bootstrap.servers"] == "b:9092"
    assert consumer["security.protocol"] == "SASL_SSL"
    assert consumer["fetch.wait.max.ms"] == "5", "the user's tuning wins over keyrange's"
    assert consumer["group.id"] == "g"
    assert consumer["isolation.level"] == "read_committed"
    assert consumer["enable.auto.commit"] is False
    producer = clients.transactional_producer("keyrange-g-0", 10_000, {"linger.ms": 5})
    assert producer["transactional.id"] == "keyrange-g-0"
    assert producer["transaction.timeout.ms"] == 10_000
    assert producer["partitioner"] == "murmur2_random"
    assert producer["sasl.mechanism"] == "SCRAM-SHA-256"
    assert clients.admin()["security.protocol"] == "SASL_SSL"
    assert clients.producer()["enable.idempotence"] is True


def test_reserved_properties_are_refused_with_the_reason() -> None:
    with pytest.raises(UserError, match=r"isolation\.level \(keyrange reads read_committed"):
        KafkaClients("b:9092", {"isolation.level": "read_uncommitted"})
    with pytest.raises(UserError, match=r"bootstrap\.servers"):
        KafkaClients("b:9092", {"bootstrap.servers": "other:9092"})


def test_spark_source_options_carry_the_properties_prefixed() -> None:
    options = KafkaClients("b:9092", {"security.protocol": "SSL"}).source_options()
    assert options == {"bootstrap": "b:9092", "kafka.security.protocol": "SSL"}


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_kafka_arguments(parser)
    return parser.parse_args(list(argv))


def test_command_line_properties_and_secrets_from_the_environment() -> None:
    args = _args("--kafka-property", "security.protocol=SASL_SSL", "--kafka-property-env", "sasl.password=PW")
    assert kafka_properties(args, {"PW": "hunter2"}) == {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    with pytest.raises(UserError, match="the environment variable PW is not set"):
        kafka_properties(args, {})
    with pytest.raises(UserError, match="--kafka-property takes KEY=VALUE"):
        kafka_properties(_args("--kafka-property", "oops"), {})
    with pytest.raises(UserError, match=r"group\.id"):
        kafka_properties(_args("--kafka-property", "group.id=x"), {})


def test_java_clients_get_the_same_security_in_their_own_names(tmp_path: Path) -> None:
    (tmp_path / "client.crt").write_text("CERT")
    (tmp_path / "client.key").write_text("KEY")
    java = java_client_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "app",
        "sasl.password": 'p"w', "ssl.ca.location": "/etc/ca.pem",
        "ssl.certificate.location": str(tmp_path / "client.crt"), "ssl.key.location": str(tmp_path / "client.key"),
        "ssl.endpoint.identification.algorithm": "none",
        "request.timeout.ms": "20000"})
    assert java == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "request.timeout.ms": "20000",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="app" '
                            'password="p\\"w";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/ca.pem",
        "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "CERT", "ssl.keystore.key": "KEY",
        "ssl.endpoint.identification.algorithm": ""}
    assert java_client_properties({"ssl.ca.pem": "PEM"}) == {"ssl.truststore.type": "PEM",
                                                             "ssl.truststore.certificates": "PEM"}
    with pytest.raises(UserError, match=r"sasl\.jaas\.config instead"):
        java_client_properties({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"})
