"""The second reader behind the aggregation, keyrange-kafka, on the embedded broker (tansu),
checked against the plain-Python reference; and why the demo needs it there.

tansu is the broker of the first test on purpose: the case is a tansu bug that Apache Kafka does
not have.
Under read_committed its ListOffsets answers 0 while a transaction is open, so Spark's connector
finds no records at all; keyrange's Python reader consumes to the end instead and finds them. That
is why `keyrange demo` (which aggregates while its workers run) reads with `keyrange-kafka`.
"""

from __future__ import annotations

from typing import Any

import pytest

from keyrange.aggregation import read_results, run_once
from keyrange.aggregation.processed_stream import CONNECTOR, PYTHON_SOURCE
from keyrange.aggregation.reference import Delivery, aggregate
from tests.integration.aggregation_helpers import (
    make_topic,
    processed_records,
    produce_processed,
    transactional_producer,
)
from tests.kafkatools import read_topic


def _events(output: str) -> int:
    return sum(c["events"] for c in read_results(output).clients)


def test_on_tansu_an_open_transaction_hides_every_record_from_the_connector_not_from_keyrange_kafka(
        spark: Any, bootstrap: str, topic_name: str, tmp_path: Any) -> None:
    make_topic(bootstrap, topic_name, 2)
    records = processed_records(400, clients=10, seed=50)
    produce_processed(bootstrap, topic_name, records, 2)
    open_txn = transactional_producer(bootstrap)
    open_txn.begin_transaction()
    for i in range(20):
        open_txn.produce(topic_name, key=b"1", value=b'{"open": true}', partition=i % 2)
    open_txn.flush(30)
    try:
        connector = run_once(bootstrap, topic_name, str(tmp_path / "connector"), spark=spark, source=CONNECTOR)
        python = run_once(bootstrap, topic_name, str(tmp_path / "python"), spark=spark, source=PYTHON_SOURCE)
    finally:
        open_txn.abort_transaction(30)
    # tansu's bug, not the connector's: ListOffsets(read_committed) should answer the last stable
    # offset (the open transaction's first), not 0. If this starts failing, tansu was fixed and
    # the demo can read with the connector too.
    assert (connector.records_read, connector.aggregated) == (0, 0)
    assert python.aggregated == len(records) == _events(str(tmp_path / "python"))


def test_keyrange_kafka_on_tansu_gives_the_plain_python_aggregates(
        spark: Any, bootstrap: str, topic_name: str, tmp_path: Any) -> None:
    """What the demo runs. (Spark's connector on Apache Kafka: test_aggregation_job.py.)"""
    source = PYTHON_SOURCE
    make_topic(bootstrap, topic_name, 3)
    records = processed_records(1200, clients=30, seed=51)
    delivered = produce_processed(bootstrap, topic_name, records + records[::9], 3, abort_every=3)
    output = str(tmp_path / source)

    summary = run_once(bootstrap, topic_name, output, spark=spark, source=source, max_records_per_batch=700)

    deliveries = [Delivery(m.partition(), m.offset(), m.value()) for m in read_topic(bootstrap, topic_name,
                                                                                         len(delivered))]
    expected = aggregate(deliveries)
    results = read_results(output)
    assert summary.batches >= 2 and summary.aggregated == len(records)
    assert results.clients == expected["clients"]
    assert results.workers == expected["workers"]
    assert [{k: pytest.approx(v) for k, v in w.items()} for w in expected["windows"]] == results.windows
