"""The StreamConsumer model: defaults, bounds, and errors that name the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyrange.spec import PATTERN_MEANINGS, SpecError, StreamConsumer, load_file, parse_document, parse_spec


def doc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"kafka": {"topic": "events"}}
    base.update(spec)
    return {
        "apiVersion": "keyrange.dev/v1alpha1",
        "kind": "StreamConsumer",
        "metadata": {"name": "payments"},
        "spec": base,
    }


def test_defaults_follow_the_design() -> None:
    sc = parse_document(doc())
    assert sc.group_id == "payments"
    assert sc.spec.sink_topic == "events.processed"
    assert sc.spec.dlq_topic == "events.dlq"
    assert sc.spec.dedup.ttl_seconds == 10
    assert sc.spec.handler == "sleep"
    assert sc.spec.kafka.bootstrap_servers is None


def test_design_example_parses() -> None:
    sc = parse_document(doc(
        kafka={"bootstrapServers": "kafka:9092", "topic": "events", "groupId": "payments"},
        handler="ledger", handlerConfig={"delayMs": 5}, dedup={"ttlSeconds": 10}, concurrency=64,
        maxPending=1000, workers={"min": 1, "max": 6},
        scaling={"lagHighRecords": 5000, "lagHighSeconds": 5, "lagLowRecords": 100, "cooldownSeconds": 60},
        sink={"topic": "events.processed"}, deadLetterTopic="events.dlq",
    ))
    assert sc.spec.workers.max == 6 and sc.spec.handler_config == {"delayMs": 5}


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"workers": {"min": 4, "max": 2}}, "workers.min (4) must not exceed workers.max (2)"),
        ({"dedup": {"ttlSeconds": 0}}, "spec.dedup.ttlSeconds"),
        ({"concurrency": 0}, "spec.concurrency"),
        ({"handler": "not a handler"}, "spec.handler"),
        ({"scaling": {"lagHighRecords": 10, "lagLowRecords": 10}}, "lagLowRecords (10) must be below"),
        ({"surprise": 1}, "spec.surprise: Extra inputs are not permitted"),
        ({"aggregation": {"enabled": True, "mode": "schedule"}}, "aggregation.schedule is required"),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kafka": {"topic": "events"}, **spec}, "payments")
    assert fragment in str(info.value)
    assert "'payments'" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kafka": {"topic": "my events"}}, "spec.kafka.topic: 'my events' is not a Kafka topic name"),
        ({"handler": "handlers.handle"}, "spec.handler: 'handlers.handle' is not a handler: sleep, ledger, noop, "
                                         "or module:function"),
        ({"input": {"clientId": "keys"}}, "spec.input.clientId: 'keys' is not a clientId mapping: key, field:<name>"),
        ({"input": {"uuid": "off"}}, "spec.input.uuid: 'off' is not a uuid mapping"),
        ({"input": {"created": "time"}},
         "spec.input.created: 'time' is not a created mapping: field:<name> or timestamp"),
        ({"deadLetterTopic": "dead letters"}, "spec.deadLetterTopic: 'dead letters' is not a Kafka topic name"),
        ({"aggregation": {"executorMemory": "lots"}}, "'lots' is not a JVM memory size such as 512m or 2g"),
    ],
)
def test_a_value_of_the_wrong_shape_is_explained_in_words_not_as_a_pattern(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kafka": {"topic": "events"}, **spec}, "payments")
    assert message in str(info.value)
    assert "should match pattern" not in str(info.value)


def test_every_pattern_of_the_spec_has_its_meaning_in_words() -> None:
    def patterns(node: object) -> set[str]:
        if isinstance(node, dict):
            found = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
            return found.union(*(patterns(v) for v in node.values()))
        if isinstance(node, list):
            return set().union(*(patterns(v) for v in node))
        return set()

    used = patterns(StreamConsumer.model_json_schema(by_alias=True))
    assert used and used <= set(PATTERN_MEANINGS), used - set(PATTERN_MEANINGS)


def test_wrong_kind_is_explained() -> None:
    bad = doc()
    bad["kind"] = "Deployment"
    with pytest.raises(SpecError, match=r"expected apiVersion: keyrange\.dev/v1alpha1 and kind: StreamConsumer"):
        parse_document(bad)


def test_load_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_file(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    with pytest.raises(SpecError, match="is not valid YAML"):
        load_file(broken)
    empty = tmp_path / "empty.yaml"
    empty.write_text("kind: ConfigMap\n")
    with pytest.raises(SpecError, match="found 0"):
        load_file(empty)


def test_a_file_that_is_not_utf8_names_the_byte_and_where_it_is(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"apiVersion: keyrange.dev/v1alpha1\nkind: StreamConsumer\nmetadata: {name: caf\xe9}\n")
    with pytest.raises(SpecError) as err:
        load_file(latin1)
    assert str(err.value) == (f"{latin1} is not UTF-8 text: byte 0xe9 at offset 75 (line 3, column 21): "
                              "invalid continuation byte; save the file as UTF-8")


SECURE_KAFKA = {
    "topic": "events", "bootstrapServers": "kafka:9093", "replicationFactor": 3,
    "clientProperties": {"security.protocol": "SASL_SSL", "sasl.username": "app"},
    "clientPropertiesFrom": [
        {"name": "sasl.password", "secretKeyRef": {"name": "kafka-user", "key": "password"}},
        {"name": "ssl.ca.pem", "env": "KAFKA_CA"},
    ],
}


def test_client_properties_take_secrets_from_the_environment() -> None:
    kafka = parse_spec({"kafka": SECURE_KAFKA}).kafka
    assert kafka.replication_factor == 3
    assert kafka.client_properties_from[0].env_name == "KEYRANGE_KAFKA_SASL_PASSWORD"
    environ = {"KEYRANGE_KAFKA_SASL_PASSWORD": "pw", "KAFKA_CA": "-----BEGIN CERTIFICATE-----"}
    assert kafka.resolved_client_properties(environ) == {
        "security.protocol": "SASL_SSL", "sasl.username": "app", "sasl.password": "pw",
        "ssl.ca.pem": "-----BEGIN CERTIFICATE-----"}


def test_an_unset_secret_variable_says_which_and_where_it_comes_from() -> None:
    kafka = parse_spec({"kafka": SECURE_KAFKA}).kafka
    with pytest.raises(SpecError) as info:
        kafka.resolved_client_properties({"KAFKA_CA": "x"})
    assert str(info.value) == (
        "spec.kafka.clientPropertiesFrom[0]: sasl.password is read from the environment variable "
        "KEYRANGE_KAFKA_SASL_PASSWORD, which is not set: export it; in a cluster the operator sets it from "
        "Secret 'kafka-user' key 'password'")


@pytest.mark.parametrize(("kafka", "fragment"), [
    ({"clientProperties": {"isolation.level": "read_uncommitted"}}, "may not set isolation.level (keyrange reads"),
    ({"clientPropertiesFrom": [{"name": "transactional.id"}]}, "may not set transactional.id"),
    ({"clientProperties": {"sasl.password": "a"}, "clientPropertiesFrom": [{"name": "sasl.password"}]},
     "client properties set more than once: sasl.password"),
    ({"clientProperties": {"linger.ms": 5}}, "spec.kafka.clientProperties.linger.ms: Input should be a valid string"),
    ({"replicationFactor": 0}, "spec.kafka.replicationFactor"),
])
def test_client_properties_keyrange_owns_are_refused(kafka: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"kafka": {"topic": "events", **kafka}})
    assert fragment in str(info.value)
