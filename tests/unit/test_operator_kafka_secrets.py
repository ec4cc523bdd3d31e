"""In a cluster, secret client properties come from Secrets: worker and Spark driver pods get them
as environment variables (never as arguments), and the operator reads the
same keys for its own control channel."""

from __future__ import annotations

import argparse
from typing import Any

import kubernetes_validate
import pytest

from keyrange.commands import aggregate
from keyrange.commands.kafkaargs import kafka_properties
from keyrange.errors import UserError
from keyrange.operator import rendering
from keyrange.operator.kafkasecrets import operator_client_properties
from keyrange.operator.settings import OperatorSettings
from keyrange.operator.spark import SparkJobSettings, driver_args, render_spark_application, render_spark_objects
from keyrange.spec import SpecError, parse_spec

OWNER = {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
         "metadata": {"name": "payments", "namespace": "shop", "uid": "6f1c-uid"}}
KAFKA: dict[str, Any] = {
    "topic": "events", "bootstrapServers": "kafka:9093",
    "clientProperties": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
    "clientPropertiesFrom": [{"name": "sasl.password", "secretKeyRef": {"name": "kafka-user", "key": "password"}},
                             {"name": "ssl.ca.pem", "secretKeyRef": {"name": "kafka-ca", "key": "ca.crt"},
                              "env": "CA_PEM"}],
}
SPEC = parse_spec({"kafka": KAFKA, "aggregation": {"enabled": True}})
SECRET_ENV = [
    {"name": "KEYRANGE_KAFKA_SASL_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "kafka-user", "key": "password"}}},
    {"name": "CA_PEM", "valueFrom": {"secretKeyRef": {"name": "kafka-ca", "key": "ca.crt"}}},
]


def test_worker_pods_get_the_secrets_as_environment_variables() -> None:
    sts = rendering.render_statefulset("payments", "shop", SPEC, 2, OWNER, OperatorSettings(image="k:1"))
    kubernetes_validate.validate(sts, "1.30", strict=True)
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[1:] == SECRET_ENV


def test_the_spark_driver_gets_plain_properties_as_arguments_and_secrets_as_environment() -> None:
    settings = SparkJobSettings(image="k:1")
    args = driver_args("payments", "shop", SPEC, settings)
    parser = argparse.ArgumentParser()
    aggregate.add_arguments(parser)
    parsed = parser.parse_args(args[1:])
    environ = {"KEYRANGE_KAFKA_SASL_PASSWORD": "pw", "CA_PEM": "-----BEGIN"}
    assert kafka_properties(parsed, environ) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.password": "pw",
        "ssl.ca.pem": "-----BEGIN"}
    driver = next(o for o in render_spark_objects("payments", "shop", SPEC, OWNER, settings)
                  if o["kind"] == "Deployment")
    assert driver["spec"]["template"]["spec"]["containers"][0]["env"][2:] == SECRET_ENV
    app = render_spark_application("payments", "shop", SPEC, OWNER, settings)
    assert app["spec"]["driver"]["env"] == SECRET_ENV


def test_the_operator_takes_its_own_environment_first_then_the_secret_keys() -> None:
    secrets = {("shop", "kafka-user", "password"): "pw", ("shop", "kafka-ca", "ca.crt"): "-----BEGIN"}
    assert operator_client_properties("shop", SPEC, lambda ns, name, key: secrets[(ns, name, key)], {}) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.password": "pw",
        "ssl.ca.pem": "-----BEGIN"}

    def missing(namespace: str, name: str, key: str) -> str:
        raise UserError(f"Secret {namespace}/{name} does not exist")

    with pytest.raises(UserError, match="Secret shop/kafka-user does not exist"):
        operator_client_properties("shop", SPEC, missing, {})
    own = {"KEYRANGE_KAFKA_SASL_PASSWORD": "env-pw", "CA_PEM": "env-ca"}
    assert operator_client_properties("shop", SPEC, missing, own)["sasl.password"] == "env-pw"


def test_a_secret_property_without_a_secret_ref_cannot_run_in_a_cluster() -> None:
    spec = parse_spec({"kafka": {**KAFKA, "clientPropertiesFrom": [{"name": "sasl.password"}]}})
    with pytest.raises(SpecError, match=r"clientPropertiesFrom\[0\] \(sasl.password\) needs secretKeyRef"):
        rendering.check_cluster_spec("payments", spec)
