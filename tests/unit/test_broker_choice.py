"""Which embedded broker `keyrange run` and `keyrange demo` start: Apache Kafka where Java 17+ and
its jars are found, else tansu with a line saying why and how to get Kafka; an explicit
`--engine kafka` that cannot be met is a one-line error. The lookups are injected (no JVM starts)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from keyrange.cli import main
from keyrange.errors import UserError
from keyrange.local.broker_choice import choose_broker
from keyrange.local.kafka_setup import KafkaInstall, KafkaSetupMissing, find_kafka, parse_java_version

LIBS = Path("/opt/kafka/libs")


def _missing(message: str) -> Callable[[], str]:
    def lookup() -> str:
        raise KafkaSetupMissing(message)
    return lookup


def _find(java: Callable[[], str] = lambda: "/usr/bin/java", jars: bool = True,
          version: int | None = 17) -> Callable[[], KafkaInstall]:
    def libs() -> Path:
        if not jars:
            raise KafkaSetupMissing("Apache Kafka's jars are not in /x: run `make kafka`")
        return LIBS
    return lambda: find_kafka(java, libs, lambda _: version)


def test_java_17_and_the_jars_make_apache_kafka_the_default() -> None:
    choice = choose_broker(None, _find())
    assert choice.engine == "kafka"
    assert choice.notice.startswith("embedded broker: Apache Kafka, one KRaft node")
    assert "/usr/bin/java" in choice.notice and str(LIBS) in choice.notice


def test_a_newer_java_will_do() -> None:
    assert choose_broker(None, _find(version=21)).engine == "kafka"


@pytest.mark.parametrize(("find", "why"), [
    (_find(java=_missing("Apache Kafka needs Java 17 or newer, and no `java` is on the PATH: `make kafka`")),
     "no `java` is on the PATH"),
    (_find(version=11), "/usr/bin/java is Java 11"),
    (_find(version=None), "`/usr/bin/java -version` names no version"),
    (_find(jars=False), "Apache Kafka's jars are not in /x"),
], ids=["no-java", "old-java", "unreadable-java", "no-jars"])
def test_without_java_17_or_the_jars_the_default_is_tansu_and_says_why_and_how(
        find: Callable[[], KafkaInstall], why: str) -> None:
    choice = choose_broker(None, find)
    assert choice.engine == "tansu"
    assert choice.notice.startswith("embedded broker: tansu, not Apache Kafka, because ")
    assert why in choice.notice and "`make kafka`" in choice.notice
    assert "\n" not in choice.notice


def test_asking_for_tansu_does_not_look_for_java() -> None:
    def find() -> KafkaInstall:
        raise AssertionError("looked for Java")
    choice = choose_broker("tansu", find)
    assert choice.engine == "tansu" and "--engine tansu" in choice.notice


def test_asking_for_kafka_gets_it_or_an_error_naming_the_problem_and_the_fix() -> None:
    assert choose_broker("kafka", _find()).engine == "kafka"
    with pytest.raises(UserError) as info:
        choose_broker("kafka", _find(version=11))
    assert str(info.value).startswith("--engine kafka: Apache Kafka needs Java 17 or newer, and /usr/bin/java is "
                                      "Java 11: install one (`make kafka`")
    with pytest.raises(UserError, match=r"^--engine kafka: Apache Kafka's jars are not in /x: run `make kafka`"):
        choose_broker("kafka", _find(jars=False))


@pytest.mark.parametrize(("text", "major"), [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
    ('java version "1.8.0_392"', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ("Error: could not find libjava.so", None),
])
def test_the_java_version_is_read_from_its_own_answer(text: str, major: int | None) -> None:
    assert parse_java_version(text) == major


SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {name: payments}
spec:
  kafka: {topic: payments%s}
"""


@pytest.fixture
def no_kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without the Kafka jars: an empty tools folder, no KAFKA_HOME."""
    monkeypatch.setenv("KEYRANGE_TOOLS", str(tmp_path / "tools"))
    monkeypatch.delenv("KAFKA_HOME", raising=False)


@pytest.mark.usefixtures("no_kafka")
@pytest.mark.parametrize("command", ["run", "demo"])
def test_the_commands_refuse_an_engine_they_cannot_start_in_one_line(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(SPEC % "")
    args = ["-f", str(spec)] if command == "run" else ["--out", str(tmp_path / "demo")]
    assert main([command, *args, "--engine", "kafka"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"keyrange {command}: error: --engine kafka: Apache Kafka's jars are not in ")
    assert "`make kafka`" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("spec_bootstrap", "args", "named"), [
    ("", ["--bootstrap", "kafka:9092"], "--bootstrap"),
    (", bootstrapServers: 'kafka:9092'", [], "spec.kafka.bootstrapServers"),
])
def test_run_refuses_an_engine_beside_a_bootstrap(spec_bootstrap: str, args: list[str], named: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(SPEC % spec_bootstrap)
    assert main(["run", "-f", str(spec), *args, "--engine", "tansu"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"keyrange run: error: --engine picks the embedded broker, and this run uses the Kafka at kafka:9092 "
        f"({named}): drop one of them")
