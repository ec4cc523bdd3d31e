"""Choosing and configuring the aggregation's reader, and finding Spark's Kafka connector (no Spark)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keyrange.aggregation import connector
from keyrange.aggregation.environment import SparkSetupError
from keyrange.aggregation.processed_stream import (
    CONNECTOR,
    END_OF_RANGE_WAIT_MS,
    PYTHON_SOURCE,
    StreamSettings,
    connector_options,
    python_source_options,
)
from keyrange.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def test_the_connector_reads_committed_records_with_the_client_properties_as_kafka_options():
    settings = StreamSettings("k:9092", "events.processed", CONNECTOR, max_records_per_batch=1000,
                              client_properties={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                                 "isolation.level": "read_uncommitted"})
    options = connector_options(settings)
    assert options["kafka.bootstrap.servers"] == "k:9092"
    assert options["subscribe"] == "events.processed"
    assert options["kafka.isolation.level"] == "read_committed"  # never loosened by a client property
    assert options["kafka.security.protocol"] == "SASL_SSL" and options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["maxOffsetsPerTrigger"] == "1000"
    assert options["startingOffsets"] == "earliest" and options["failOnDataLoss"] == "true"
    assert "maxOffsetsPerTrigger" not in connector_options(StreamSettings("k:9092", "t"))


def test_the_connector_does_not_wait_half_a_second_at_each_partitions_end_unless_told_to():
    assert connector_options(StreamSettings("k:9092", "t"))["kafka.fetch.max.wait.ms"] == str(END_OF_RANGE_WAIT_MS)
    assert END_OF_RANGE_WAIT_MS <= 50
    told = StreamSettings("k:9092", "t", client_properties={"fetch.max.wait.ms": "250"})
    assert connector_options(told)["kafka.fetch.max.wait.ms"] == "250"


def test_the_python_source_takes_the_same_settings_in_its_own_option_names():
    settings = StreamSettings("k:9092", "t", PYTHON_SOURCE, '{"t": {"0": 5, "1": 7}}', 300)
    assert python_source_options(settings) == {
        "bootstrap": "k:9092", "topic": "t", "startingOffsets": '{"0": 5, "1": 7}', "maxRecordsPerBatch": "300",
    }
    assert python_source_options(StreamSettings("k:9092", "t", PYTHON_SOURCE, "latest"))["startingOffsets"] == "latest"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"source": "jdbc"}, "must be one of kafka, keyrange-kafka"),
    ({"max_records_per_batch": 0}, "at least 1"),
])
def test_bad_settings_say_what_is_allowed(kwargs, message):
    with pytest.raises(UserError, match=message):
        StreamSettings("k:9092", "t", **kwargs)


@pytest.mark.parametrize(("source", "starting"), [
    (CONNECTOR, "yesterday"), (CONNECTOR, "{not json"), (CONNECTOR, '{"0": 42}'), (CONNECTOR, '{"other": {"0": 1}}'),
    (CONNECTOR, '{"t": {"0": 1}, "other": {"0": 1}}'), (CONNECTOR, '{"t": {"zero": 1}}'),
    (CONNECTOR, '{"t": {"0": -3}}'),
    (CONNECTOR, '{"t": {"0": "42"}}'), (CONNECTOR, '{"t": {}}'), (PYTHON_SOURCE, '{"0": true}'), (PYTHON_SOURCE, "[]"),
])
def test_a_start_spark_would_refuse_once_the_query_runs_is_refused_here_with_the_form_it_takes(source, starting):
    with pytest.raises(UserError) as info:
        StreamSettings("k:9092", "t", source, starting)
    assert str(info.value) == ('the starting offsets must be earliest, latest or JSON like {"t": {"0": 42}} (offsets '
                               f"per partition of 't'; -2 earliest, -1 latest), got {starting!r}")


@pytest.mark.parametrize(("source", "starting"), [
    (CONNECTOR, "earliest"), (CONNECTOR, "latest"), (CONNECTOR, '{"t": {"0": 42, "3": -2}}'),
    (PYTHON_SOURCE, '{"t": {"0": 42}}'), (PYTHON_SOURCE, '{"0": 42, "1": -1}'),
])
def test_the_starts_each_source_takes_are_taken(source, starting):
    assert StreamSettings("k:9092", "t", source, starting).starting_offsets == starting


def _jars(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True)
    for name in (f"spark-sql-kafka-0-10_2.13-{version}.jar", "kafka-clients-3.9.2.jar"):
        (folder / name).write_bytes(b"")
    return folder


def test_the_connector_is_found_in_the_tools_folder_for_pysparks_version(tmp_path, monkeypatch):
    version = connector.pyspark_version()
    monkeypatch.delenv(connector.JARS_ENV, raising=False)
    monkeypatch.setenv("KEYRANGE_TOOLS", str(tmp_path))
    _jars(tmp_path / "spark-jars" / "0.0.1", "0.0.1")  # another PySpark's: not used
    assert connector.connector_jars() is None
    _jars(tmp_path / "spark-jars" / version, version)
    conf = connector.spark_jars_conf({"spark.jars": "/extra/udf.jar"}, required=True)
    listed = conf["spark.jars"].split(",")
    assert listed[0] == "/extra/udf.jar"  # the user's own jars stay
    assert {Path(p).name for p in listed[1:]} == {f"spark-sql-kafka-0-10_2.13-{version}.jar", "kafka-clients-3.9.2.jar"}


def test_a_folder_named_by_the_environment_wins_and_spark_jars_packages_needs_nothing(tmp_path, monkeypatch):
    version = connector.pyspark_version()
    monkeypatch.setenv(connector.JARS_ENV, str(_jars(tmp_path / "image", version)))
    assert connector.connector_jars() == sorted((tmp_path / "image").glob("*.jar"))
    packages = {"spark.jars.packages": connector.package_coordinate()}
    assert connector.spark_jars_conf(packages, required=True) == {}


def test_a_missing_connector_says_how_to_install_it_or_to_use_packages(tmp_path, monkeypatch):
    monkeypatch.delenv(connector.JARS_ENV, raising=False)
    monkeypatch.setenv("KEYRANGE_TOOLS", str(tmp_path))
    with pytest.raises(SparkSetupError, match=r"make tools.*spark\.jars\.packages=org\.apache\.spark:spark-sql-kafka"):
        connector.spark_jars_conf({}, required=True)
    assert connector.spark_jars_conf({}, required=False) == {}  # the Python reader needs none


def test_the_image_fetches_the_connector_and_points_keyrange_at_it():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"install-spark-connector\.sh /opt/keyrange/tools /opt/keyrange/bin/python", dockerfile)
    assert "KEYRANGE_TOOLS=/opt/keyrange/tools" in dockerfile
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!scripts/install-spark-connector.sh" in ignore and "!scripts/spark-connector/" in ignore


def test_the_pinned_pyspark_is_the_installed_one():
    """The connector is fetched for the installed PySpark; the extra pins the version Maven serves."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"pyspark=={connector.pyspark_version()}"' in pyproject
