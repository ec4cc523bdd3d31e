"""The example StreamConsumers run with `keyrange run -f` as they are: they must validate."""

from pathlib import Path

import pytest
import yaml

from keyrange.ranges.planner import ScalingLimits
from keyrange.spec import load_file
from tests.operator.crd_schema import admit_streamconsumer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["streamconsumer.yaml", "ledger.yaml", "existing-topic.yaml",
                                  "existing-topic-decoder.yaml"])
def test_example_validates_and_can_scale(name: str) -> None:
    consumer = load_file(EXAMPLES / name)
    limits = ScalingLimits.from_spec(consumer.spec)
    assert 1 <= limits.min_workers < limits.max_workers <= consumer.spec.kafka.partitions


@pytest.mark.parametrize("name", ["existing-topic.yaml", "existing-topic-decoder.yaml"])
def test_existing_topic_examples_are_admitted_and_read_their_records(name: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as `PYTHONPATH=examples` in the example's comment
    document = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    _, errors = admit_streamconsumer(document)
    assert not errors, f"the CRD refuses {name}: {errors}"
    parser = load_file(EXAMPLES / name).spec.input.mapping().parser
    if name == "existing-topic.yaml":
        event = parser.parse(b"user-7f3a9c", b'{"op": "increment", "amount": 5}', [("event-id", b"e-1")], 1_000)
        assert event[:3] == ("user-7f3a9c", "e-1", 1_000)
    else:
        event = parser.parse(None, b"acct-17,tx-0042,250", None, 2_000)
        assert event[:3] == ("acct-17", "tx-0042", 2_000) and event.body["amount"] == 250
