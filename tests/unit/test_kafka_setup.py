"""The Apache Kafka launcher's pure parts: where the jars are, and each node's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyrange.local.kafka_setup import (
    KafkaSetupMissing,
    NodeAddress,
    class_archive,
    kafka_libs,
    min_insync_replicas,
    server_properties,
    write_properties,
)


def _libs(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "kafka_2.13-4.4.0.jar").write_bytes(b"")
    return folder


@pytest.mark.parametrize(("nodes", "isr"), [(1, 1), (2, 1), (3, 2), (5, 2)])
def test_min_insync_replicas_leaves_room_to_lose_one_node(nodes: int, isr: int) -> None:
    assert min_insync_replicas(nodes) == isr


def test_a_three_node_quorum_replicates_everything_three_times(tmp_path: Path) -> None:
    cluster = [NodeAddress(i, 9000 + i, 9100 + i, {"SECURE": 9200 + i}) for i in (1, 2, 3)]
    props = server_properties(cluster[1], cluster, tmp_path, {"SECURE": "SASL_SSL"}, {"num.io.threads": "8"})
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102,SECURE://127.0.0.1:9202"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9002,SECURE://127.0.0.1:9202"
    assert "SECURE:SASL_SSL" in props["listener.security.protocol.map"].split(",")
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert props[key] == "3"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["num.io.threads"] == "8", "overrides win"


def test_only_a_node_with_peers_is_fenced_quickly(tmp_path: Path) -> None:
    """A cluster hands a silent node's partitions over after 4 s; a single node has nobody to
    hand them to, and fencing it would fail every request while its JVM is starved."""
    trio = [NodeAddress(i, 9000 + i, 9100 + i, {}) for i in (1, 2, 3)]
    assert server_properties(trio[0], trio, tmp_path)["broker.session.timeout.ms"] == "4000"
    alone = [NodeAddress(1, 9001, 9101, {})]
    assert int(server_properties(alone[0], alone, tmp_path)["broker.session.timeout.ms"]) >= 9000


def test_properties_are_written_as_java_reads_them(tmp_path: Path) -> None:
    write_properties(tmp_path / "p", {"a": "x\\y", "b": "line\nbreak"})
    assert (tmp_path / "p").read_text() == "a=x\\\\y\nb=line\\nbreak\n"


def test_kafka_home_wins_over_the_tools_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _libs(tmp_path / "tools" / "kafka" / "libs")
    home_libs = _libs(tmp_path / "home" / "libs")
    monkeypatch.setenv("KEYRANGE_TOOLS", str(tmp_path / "tools"))
    monkeypatch.setenv("KAFKA_HOME", str(tmp_path / "home"))
    assert kafka_libs() == home_libs
    monkeypatch.delenv("KAFKA_HOME")
    assert kafka_libs() == tmp_path / "tools" / "kafka" / "libs"


def test_missing_jars_name_both_places_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEYRANGE_TOOLS", str(tmp_path / "tools"))
    monkeypatch.setenv("KAFKA_HOME", str(tmp_path / "empty-home"))
    with pytest.raises(KafkaSetupMissing) as info:
        kafka_libs()
    message = str(info.value)
    assert str(tmp_path / "tools" / "kafka" / "libs") in message
    assert str(tmp_path / "empty-home" / "libs") in message
    assert "make tools" in message and "KAFKA_HOME" in message


def test_the_class_archive_lives_in_the_tools_folder_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libs = _libs(tmp_path / "libs")
    java = tmp_path / "java"
    java.write_bytes(b"")
    monkeypatch.setenv("KEYRANGE_TOOLS", str(tmp_path / "tools"))
    assert class_archive(str(java), libs) is None
    (tmp_path / "tools" / "kafka").mkdir(parents=True)
    archive = class_archive(str(java), libs)
    assert archive is not None and archive.parent == tmp_path / "tools" / "kafka"
    (libs / "another-1.0.jar").write_bytes(b"")
    assert class_archive(str(java), libs) != archive, "other jars need another archive"
