"""Kafka client properties on the command line, shared by the commands that talk to Kafka.

`--kafka-property KEY=VALUE` gives a plain value; `--kafka-property-env KEY=VARIABLE` reads a
secret from an environment variable, so it never shows in the process list. Both repeat, and
both add to (and win over) what a StreamConsumer's `spec.kafka` gives.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from keyrange.errors import UserError
from keyrange.kafkaclients import check_client_properties


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--kafka-property` and `--kafka-property-env` options."""
    parser.add_argument("--kafka-property", action="append", default=[], metavar="KEY=VALUE",
                        help="a librdkafka client property for every Kafka client, repeatable "
                             "(e.g. security.protocol=SASL_SSL)")
    parser.add_argument("--kafka-property-env", action="append", default=[], metavar="KEY=VARIABLE",
                        help="a client property read from an environment variable, repeatable "
                             "(e.g. sasl.password=KAFKA_PASSWORD)")


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{option} takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


def kafka_properties(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The client properties the options give; UserError for a malformed one or an unset variable."""
    environ = os.environ if environ is None else environ
    properties = _pairs(args.kafka_property, "--kafka-property")
    for key, variable in _pairs(args.kafka_property_env, "--kafka-property-env").items():
        if variable not in environ:
            raise UserError(f"--kafka-property-env {key}={variable}: the environment variable {variable} is not set")
        properties[key] = environ[variable]
    check_client_properties(properties, "--kafka-property")
    return properties
