"""The operator's own Kafka client properties: the spec's plain values plus the values its
`clientPropertiesFrom` entries name, for the operator's control channel.

Worker and Spark driver pods get those Secret keys as environment variables
(`rendering.kafka_secret_env`). The operator takes each value from its own environment variable
of the same name when it has one (the chart's default role grants no access to Secrets), else
reads the Secret key through the Kubernetes API, which needs `get` on secrets in that namespace.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Mapping

from keyrange.errors import UserError
from keyrange.spec import StreamConsumerSpec

SecretReader = Callable[[str, str, str], str]
"""(namespace, Secret name, key) -> the key's value."""


def read_secret_key(namespace: str, secret: str, key: str) -> str:
    """One key of a Secret, decoded; UserError naming what is missing."""
    from keyrange.operator.kube import Kube, KubeApiError

    try:
        obj = Kube().get("v1", "Secret", namespace, secret)
    except KubeApiError as exc:
        if exc.status != 403:
            raise
        raise UserError(f"the operator may not read Secret {namespace}/{secret} (named in "
                        "spec.kafka.clientPropertiesFrom): give the operator the value in its environment, "
                        "or grant its role get on secrets in that namespace") from None
    if obj is None:
        raise UserError(f"Secret {namespace}/{secret} (named in spec.kafka.clientPropertiesFrom) does not exist")
    data = obj.get("data") or {}
    if key not in data:
        raise UserError(f"Secret {namespace}/{secret} has no key {key!r} (named in spec.kafka.clientPropertiesFrom)")
    try:
        return base64.b64decode(data[key], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise UserError(f"Secret {namespace}/{secret} key {key!r} is not UTF-8 text") from None


def operator_client_properties(namespace: str, spec: StreamConsumerSpec, read: SecretReader = read_secret_key,
                               environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The client properties the operator's Kafka clients use for this StreamConsumer."""
    environ = os.environ if environ is None else environ
    properties = dict(spec.kafka.client_properties)
    for index, item in enumerate(spec.kafka.client_properties_from):
        if item.env_name in environ:
            properties[item.name] = environ[item.env_name]
            continue
        if item.secret_key_ref is None:
            raise UserError(f"spec.kafka.clientPropertiesFrom[{index}] ({item.name}) needs secretKeyRef in a cluster")
        properties[item.name] = read(namespace, item.secret_key_ref.name, item.secret_key_ref.key)
    return properties
