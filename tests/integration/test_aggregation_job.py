"""The aggregation job end to end on Apache Kafka (the reference broker) and Spark local[2], reading
with Spark's own Kafka connector.

Every aggregate is checked against `keyrange.aggregation.reference` (plain Python over the very
records read back from the topic), with re-delivered records, aborted transactions, invalid
records, reruns from the checkpoint and a replayed micro-batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from keyrange.aggregation import read_results, run_once, start_continuous
from keyrange.aggregation.job import AggregationError, BatchAggregator
from keyrange.aggregation.reference import Delivery, aggregate
from tests.integration.aggregation_helpers import (
    make_topic,
    processed_records,
    produce_processed,
    transactional_producer,
    with_text_ids,
)
from tests.kafkatools import read_topic


@pytest.fixture
def bootstrap(kafka_bootstrap: str) -> str:
    """Every test here runs on Apache Kafka."""
    return kafka_bootstrap


def _deliveries(bootstrap: str, topic: str, expect: int | None) -> list[Delivery]:
    return [Delivery(m.partition(), m.offset(), m.value()) for m in read_topic(bootstrap, topic, expect)]


def _assert_matches(output: str, deliveries: Sequence[Delivery]) -> dict[str, list[dict[str, Any]]]:
    expected = aggregate(deliveries)
    results = read_results(output)
    got = {"clients": results.clients, "windows": results.windows, "workers": results.workers}
    for table, rows in expected.items():
        assert len(got[table]) == len(rows), table
        for want, have in zip(rows, got[table], strict=True):
            assert set(have) == set(want), table
            for column, value in want.items():
                if isinstance(value, float):
                    assert have[column] == pytest.approx(value, rel=1e-9), (table, column, want)
                else:
                    assert have[column] == value, (table, column, want, have)
    return expected


def _with_redeliveries(records: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """The records, then every `every`-th one again (a worker re-delivering after a crash)."""
    return records + records[::every]


def test_every_aggregate_matches_plain_python_and_duplicates_count_once(spark, bootstrap, topic_name, tmp_path):
    make_topic(bootstrap, topic_name, 4)
    records = processed_records(4000, clients=60, seed=11)
    delivered = produce_processed(bootstrap, topic_name, _with_redeliveries(records, 7), 4, abort_every=4)
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    for value in (b"not json", b'{"clientId": 5}', b"[1, 2]"):
        producer.produce(topic_name, key=b"5", value=value, partition=1)
    producer.commit_transaction(30)

    summary = run_once(bootstrap, topic_name, str(tmp_path / "out"), spark=spark)

    deliveries = _deliveries(bootstrap, topic_name, len(delivered) + 3)
    assert len(deliveries) == len(delivered) + 3
    expected = _assert_matches(str(tmp_path / "out"), deliveries)
    assert summary.records_read == len(delivered) + 3
    assert summary.invalid == 3
    assert summary.aggregated == len(records) == sum(c["events"] for c in expected["clients"])
    assert summary.duplicates == len(delivered) - len(records)
    assert sum(w["events"] for w in expected["windows"]) == len(records)
    assert any(c["ledger_value"] not in (None, 0) for c in expected["clients"])


def test_text_client_ids_group_as_text_across_batches(spark, bootstrap, topic_name, tmp_path):
    """Processed records of consumers with text ids (spec.input): the job groups by the id as text,
    across a stored batch and a new one, as the reference does; 1005 and "1005" are one client."""
    make_topic(bootstrap, topic_name, 4)
    first = with_text_ids(processed_records(900, clients=30, seed=21))
    second = with_text_ids(processed_records(700, clients=30, seed=22, start_ms=1_790_000_030_000, first_offset=5_000))
    n = len(produce_processed(bootstrap, topic_name, first, 4))
    run_once(bootstrap, topic_name, str(tmp_path / "out"), spark=spark)
    n += len(produce_processed(bootstrap, topic_name, second, 4))
    summary = run_once(bootstrap, topic_name, str(tmp_path / "out"), spark=spark)

    assert summary.invalid == 0
    expected = _assert_matches(str(tmp_path / "out"), _deliveries(bootstrap, topic_name, n))
    ids = [c["client_id"] for c in expected["clients"]]
    assert all(isinstance(c, str) for c in ids) and len(ids) == len(set(ids))
    assert any(c.startswith("kunde-ü") for c in ids) and any(c.startswith("user-") for c in ids)
    both = {r["clientId"] for r in first + second} & {str(r["clientId"]) for r in first + second if
                                                      isinstance(r["clientId"], int)}
    assert both, "no client appears both as an integer and as its text"
    assert sum(c["events"] for c in expected["clients"]) == len(first) + len(second)


def test_results_of_other_shapes_have_no_ledger_value_and_do_not_fail_the_job(spark, bootstrap, topic_name,
                                                                               tmp_path):
    """Another handler's result, or a ledger value that is not a 64-bit integer, gives a null
    ledger value, as in the reference; the rest of the record still counts."""
    make_topic(bootstrap, topic_name, 2)
    records = processed_records(60, clients=6, seed=15)
    shapes: list[Any] = [{"value": 1.5}, {"value": "7"}, {"value": True}, {"value": 2**63}, 5, [1], None, "ok"]
    for i, record in enumerate(records[::3]):
        record["result"] = shapes[i % len(shapes)]
    n = len(produce_processed(bootstrap, topic_name, records, 2))

    summary = run_once(bootstrap, topic_name, str(tmp_path / "out"), spark=spark)

    assert (summary.aggregated, summary.invalid) == (len(records), 0)
    expected = _assert_matches(str(tmp_path / "out"), _deliveries(bootstrap, topic_name, n))
    assert any(c["ledger_value"] is None for c in expected["clients"])


def test_rerun_reads_only_new_records_and_dedups_against_earlier_runs(spark, bootstrap, topic_name, tmp_path):
    make_topic(bootstrap, topic_name, 3)
    output = str(tmp_path / "out")
    first = processed_records(1500, clients=25, seed=12)
    n1 = len(produce_processed(bootstrap, topic_name, first, 3))
    s1 = run_once(bootstrap, topic_name, output, spark=spark, max_records_per_batch=900)
    assert (s1.records_read, s1.aggregated) == (n1, len(first))
    assert s1.batches >= 2  # the backlog was split, and the batches still add up

    # New records for the same clients and minutes, plus re-deliveries of records already aggregated.
    second = processed_records(1200, clients=25, seed=13, start_ms=1_790_000_030_000, first_offset=10_000)
    n2 = len(produce_processed(bootstrap, topic_name, second + first[::5], 3))
    s2 = run_once(bootstrap, topic_name, output, spark=spark)
    assert s2.records_read == n2  # only what is new since the checkpoint
    assert s2.aggregated == len(second)
    assert s2.duplicates == len(first[::5])

    _assert_matches(output, _deliveries(bootstrap, topic_name, n1 + n2))
    assert read_results(output).manifest["batch"] == s2.last_batch_id


def test_a_replayed_micro_batch_does_not_count_twice(spark, bootstrap, topic_name, tmp_path):
    """Spark re-runs the last micro-batch after a crash between writing and committing it."""
    make_topic(bootstrap, topic_name, 2)
    records = processed_records(800, clients=10, seed=14)
    n = len(produce_processed(bootstrap, topic_name, records, 2))
    batch = spark.read.format("keyrange-kafka").option("bootstrap", bootstrap).option("topic", topic_name).load()
    output = str(tmp_path / "out")

    first_half = batch.where("offset < 200")
    aggregator = BatchAggregator(spark, output)
    aggregator(first_half, 0)
    aggregator(batch.where("offset >= 200"), 1)
    aggregator(batch.where("offset >= 200"), 1)  # the replay

    _assert_matches(output, _deliveries(bootstrap, topic_name, n))


@pytest.mark.slow
def test_continuous_mode_makes_new_records_visible(spark, bootstrap, topic_name, tmp_path):
    make_topic(bootstrap, topic_name, 3)
    output = str(tmp_path / "out")
    running = start_continuous(bootstrap, topic_name, output, spark=spark, trigger_seconds=1.0)
    try:
        expected_events = 0
        for round_ in range(2):
            records = processed_records(500, clients=20, seed=20 + round_,
                                        start_ms=1_790_000_000_000 + round_ * 60_000, first_offset=round_ * 10_000)
            produce_processed(bootstrap, topic_name, _with_redeliveries(records, 10), 3)
            expected_events += len(records)
            deadline = time.monotonic() + 180
            while sum(c["events"] for c in read_results(output).clients) < expected_events:
                assert running.query.exception() is None, running.query.exception()
                assert time.monotonic() < deadline, f"aggregates never reached {expected_events} events"
                time.sleep(0.5)
    finally:
        running.stop()
    deliveries = _deliveries(bootstrap, topic_name, None)
    _assert_matches(output, deliveries)
    assert running.summary.aggregated == expected_events


def test_an_output_without_histograms_is_refused_not_extended_wrongly(spark, bootstrap, topic_name, tmp_path):
    """An older keyrange kept the records' timings instead of histograms: extending its windows
    from the new records alone would be wrong, so the job says what to do instead."""
    import shutil

    make_topic(bootstrap, topic_name, 1)
    output = tmp_path / "out"
    produce_processed(bootstrap, topic_name, processed_records(50, clients=3, seed=16), 1)
    run_once(bootstrap, topic_name, str(output), spark=spark)
    shutil.rmtree(output / "histograms")
    produce_processed(bootstrap, topic_name, processed_records(50, clients=3, seed=17, first_offset=100), 1)
    with pytest.raises(AggregationError, match=r"older keyrange .* aggregate into a new --output"):
        run_once(bootstrap, topic_name, str(output), spark=spark)


def test_missing_topic_is_a_clear_error_before_spark_starts(bootstrap, topic_name, tmp_path):
    with pytest.raises(AggregationError, match=r"does not exist .* start the workers first"):
        run_once(bootstrap, topic_name, str(tmp_path / "out"))


def test_cli_aggregates_once_and_reports_a_summary(spark, bootstrap, topic_name, tmp_path, capsys):
    import json

    from keyrange.cli import main

    make_topic(bootstrap, topic_name, 2)
    records = processed_records(600, clients=12, seed=30)
    n = len(produce_processed(bootstrap, topic_name, _with_redeliveries(records, 3), 2))
    output = str(tmp_path / "out")
    argv = ["aggregate", "--bootstrap", bootstrap, "--topic", topic_name, "--output", output, "--once", "--json"]

    assert main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["records_read"], summary["aggregated"], summary["clients"]) == (n, len(records), 12)
    assert "batch 0:" in captured.err  # progress
    _assert_matches(output, _deliveries(bootstrap, topic_name, n))

    assert main(argv) == 0  # nothing new: no batch, same tables
    again = json.loads(capsys.readouterr().out)
    assert (again["batches"], again["records_read"], again["clients"]) == (0, 0, 12)


def test_cli_missing_topic_exits_2_with_one_line(bootstrap, topic_name, tmp_path, capsys):
    from keyrange.cli import main

    argv = ["aggregate", "--bootstrap", bootstrap, "--topic", topic_name, "--output", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keyrange aggregate: error: topic") and "\n" not in err


@pytest.mark.slow
def test_cli_continuous_stops_cleanly_on_sigterm(bootstrap, topic_name, tmp_path):
    """What Kubernetes does to the driver pod: SIGTERM ends the query, the summary is printed,
    exit 0, and the aggregates hold every record."""
    import os
    import signal
    import subprocess
    import sys

    make_topic(bootstrap, topic_name, 2)
    records = processed_records(300, clients=8, seed=40)
    produce_processed(bootstrap, topic_name, records, 2)
    output = tmp_path / "out"
    err = tmp_path / "stderr.txt"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keyrange.cli", "aggregate", "--bootstrap", bootstrap, "--topic", topic_name,
             "--output", str(output), "--continuous", "--trigger-seconds", "1", "--master", "local[1]"],
            stdout=subprocess.PIPE, stderr=err_file, text=True,
            env={**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)})
        try:
            deadline = time.monotonic() + 240
            while "batch 0:" not in err.read_text():
                assert proc.poll() is None, err.read_text()[-2000:]
                assert time.monotonic() < deadline, "no micro-batch within 240 s"
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err.read_text()[-2000:]
    assert "300 aggregated" in out and "8 clients" in out
    assert sum(c["events"] for c in read_results(str(output)).clients) == 300
