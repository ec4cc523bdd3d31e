"""What the operator refuses itself, for specs stored past the CRD (an older CRD) or that the CRD
cannot judge (a cluster-only requirement, an installation without Spark rights)."""

from __future__ import annotations

from typing import Any

import pytest

from keyrange.operator.handlers import parse_cluster_spec
from keyrange.operator.settings import OperatorSettings
from keyrange.spec import SpecError

KAFKA = {"topic": "t", "bootstrapServers": "kafka:9092"}


@pytest.mark.parametrize(("spec", "message"), [
    ({"kafka": KAFKA, "workers": {"min": 5, "max": 2}}, "invalid spec"),
    ({"kafka": KAFKA, "handler": "not a handler"}, "invalid spec"),
    ({"kafka": {"topic": "t"}}, "spec.kafka.bootstrapServers is required in a cluster"),
])
def test_specs_a_cluster_cannot_run_are_refused_with_the_reason(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_cluster_spec("c", spec, OperatorSettings())


def test_aggregation_is_refused_where_the_installation_runs_no_spark() -> None:
    spec = {"kafka": KAFKA, "aggregation": {"enabled": True, "output": "s3a://b/o"}}
    assert parse_cluster_spec("c", spec, OperatorSettings()).aggregation.enabled
    with pytest.raises(SpecError, match=r"rbac.sparkAggregation: false"):
        parse_cluster_spec("c", spec, OperatorSettings(spark_aggregation=False))
