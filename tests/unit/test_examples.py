"""The example StreamConsumers run with `keyrange run -f` as they are: they must validate."""

from pathlib import Path

import pytest

from keyrange.ranges.planner import ScalingLimits
from keyrange.spec import load_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["streamconsumer.yaml", "ledger.yaml"])
def test_example_validates_and_can_scale(name: str) -> None:
    consumer = load_file(EXAMPLES / name)
    limits = ScalingLimits.from_spec(consumer.spec)
    assert 1 <= limits.min_workers < limits.max_workers <= consumer.spec.kafka.partitions
