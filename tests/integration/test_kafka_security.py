"""Client properties reach every Kafka client keyrange makes: `keyrange run` (its topics, the
controller's control channel, the load), the worker processes, and the aggregation job reading
with Spark's own (Java) Kafka connector, against a real Apache Kafka
listener that takes only TLS with SASL/SCRAM; and the clients refuse a broker certificate from an
untrusted CA or for another host. The test makes its own CAs and broker certificates (openssl) and
the broker's SCRAM credentials (`kafka-storage format --add-scram`). The password
reaches keyrange only through an environment variable (`spec.kafka.clientPropertiesFrom`)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from keyrange.aggregation import run_once
from keyrange.kafkaio import KafkaSetupError, partition_counts
from keyrange.loadgen import LoadShape
from keyrange.local.kafka_cluster import QUICK_START_JVM_OPTIONS, KafkaCluster
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.supervisor import Supervisor
from keyrange.spec import load_file
from tests.checkers import check_all
from tests.integration.aggregation_helpers import make_topic, processed_records, produce_processed
from tests.kafka_cluster_helpers import bootstrap_for
from tests.kafkatools import read_counts, read_input_log, read_processed

pytestmark = pytest.mark.xdist_group("spark")
"""Every test here runs on the Spark worker (tests/parallel.py): the aggregation test must, and the
module's secure Kafka node is then started once, not once more on another xdist worker."""

USER, PASSWORD = "keyrange-app", "s3cret-scram-pw"
PASSWORD_VARIABLE = "TEST_KAFKA_SCRAM_PASSWORD"

SPEC = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {{name: secure}}
spec:
  kafka:
    bootstrapServers: "{bootstrap}"
    topic: {topic}
    partitions: 4
    clientProperties:
      security.protocol: SASL_SSL
      sasl.mechanism: SCRAM-SHA-256
      sasl.username: {user}
      ssl.ca.location: "{ca}"
    clientPropertiesFrom:
      - name: sasl.password
        env: {variable}
        secretKeyRef: {{name: kafka-credentials, key: password}}
  handler: ledger
  handlerConfig: {{delayMs: 1}}
  workers: {{min: 1, max: 1}}
"""


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA; returns (key, certificate)."""
    ca_key, ca_cert = folder / f"{name}.key", folder / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=keyrange {name}",
             "-keyout", str(ca_key), "-out", str(ca_cert))
    return ca_key, ca_cert


def make_keystore(folder: Path, name: str, ca: tuple[Path, Path], subject_alt_names: str) -> Path:
    """A broker certificate for `subject_alt_names` signed by `ca`, as Kafka's PEM keystore."""
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.crt"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    (folder / f"{name}.ext").write_text(f"subjectAltName={subject_alt_names}\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial",
             "-days", "2", "-extfile", str(folder / f"{name}.ext"), "-out", str(cert))
    # Kafka's PEM keystore: an unencrypted PKCS#8 key followed by the certificate.
    pkcs8 = subprocess.run(["openssl", "pkcs8", "-topk8", "-nocrypt", "-in", str(key)], check=True,
                           capture_output=True, text=True).stdout
    keystore = folder / f"{name}-keystore.pem"
    keystore.write_text(pkcs8 + cert.read_text())
    return keystore


@dataclass(frozen=True)
class SecureKafka:
    """A Kafka node with a SASL_SSL listener beside its PLAINTEXT one."""

    cluster: KafkaCluster
    secure_bootstrap: str
    ca: Path
    wrong_host_bootstrap: str
    """A TLS listener whose certificate, signed by the same CA, names another host than 127.0.0.1."""
    untrusted_ca: Path
    """A CA that signed nothing the broker serves."""

    def client_properties(self, password: str = PASSWORD) -> dict[str, str]:
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": USER,
                "sasl.password": password, "ssl.ca.location": str(self.ca)}


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    folder = tmp_path_factory.mktemp("certs")
    ca = make_ca(folder, "ca")
    keystore = make_keystore(folder, "broker", ca, "IP:127.0.0.1,DNS:localhost")
    wrong_host = make_keystore(folder, "elsewhere", ca, "DNS:kafka.elsewhere.test")
    untrusted_ca = make_ca(folder, "untrusted-ca")[1]
    listener = "listener.name.secure"
    cluster = KafkaCluster(
        nodes=1, jvm_options=QUICK_START_JVM_OPTIONS, extra_listeners={"SECURE": "SASL_SSL", "ELSEWHERE": "SSL"},
        broker_config={
            "listener.name.elsewhere.ssl.keystore.type": "PEM",
            "listener.name.elsewhere.ssl.keystore.location": str(wrong_host),
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
            f"{listener}.sasl.enabled.mechanisms": "SCRAM-SHA-256",
            f"{listener}.scram-sha-256.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"{listener}.ssl.keystore.type": "PEM",
            f"{listener}.ssl.keystore.location": str(keystore),
        },
        format_args=["--add-scram", f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]"],
    )
    with cluster:
        yield SecureKafka(cluster, bootstrap_for(cluster, "SECURE"), ca[1], bootstrap_for(cluster, "ELSEWHERE"),
                          untrusted_ca)


def test_the_secure_listener_refuses_a_wrong_password(secure_kafka: SecureKafka) -> None:
    assert partition_counts(secure_kafka.secure_bootstrap, 20, secure_kafka.client_properties()) is not None
    with pytest.raises(KafkaSetupError, match="cannot reach Kafka"):
        partition_counts(secure_kafka.secure_bootstrap, 5, secure_kafka.client_properties("wrong"))


def test_a_broker_certificate_from_an_untrusted_ca_is_refused(secure_kafka: SecureKafka) -> None:
    untrusted = {**secure_kafka.client_properties(), "ssl.ca.location": str(secure_kafka.untrusted_ca)}
    with pytest.raises(KafkaSetupError, match="cannot reach Kafka"):
        partition_counts(secure_kafka.secure_bootstrap, 5, untrusted)


def test_a_broker_certificate_for_another_host_is_refused(secure_kafka: SecureKafka) -> None:
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(secure_kafka.ca)}
    # The same listener with host name checks off answers: only the name is wrong.
    unchecked = {**tls, "ssl.endpoint.identification.algorithm": "none"}
    assert partition_counts(secure_kafka.wrong_host_bootstrap, 20, unchecked) is not None
    with pytest.raises(KafkaSetupError, match="cannot reach Kafka"):
        partition_counts(secure_kafka.wrong_host_bootstrap, 5, tls)


def test_keyrange_run_works_end_to_end_over_tls_and_scram(secure_kafka: SecureKafka, topic_name: str,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secure.yaml"
    path.write_text(SPEC.format(bootstrap=secure_kafka.secure_bootstrap, topic=topic_name, user=USER,
                                ca=secure_kafka.ca, variable=PASSWORD_VARIABLE))
    # The supervisor and the worker processes it starts read the password from here.
    monkeypatch.setenv(PASSWORD_VARIABLE, PASSWORD)
    consumer = load_file(path)
    supervisor = Supervisor(consumer, path, None, tmp_path / "run", tick_seconds=0.5)
    stop = threading.Event()
    totals = LoadTotals()
    supervisor.start()
    try:
        assert supervisor.bootstrap == secure_kafka.secure_bootstrap
        assert supervisor.client_properties["sasl.password"] == PASSWORD
        shape = LoadShape(rate=400, clients=50, duplicate_ratio=0.05, ledger=True, seed=11)
        produce_phases(supervisor.bootstrap, topic_name, shape, [Phase(5, 400)], stop, totals,
                       supervisor.client_properties)
        # Checked through the PLAINTEXT listener of the same broker: what the test reads is not the point.
        plain = secure_kafka.cluster.bootstrap
        log = read_input_log(plain, topic_name, totals.sent)
        distinct = len({e.uuid for e in log})
        processed = read_processed(plain, f"{topic_name}.processed", distinct, timeout_seconds=120)
    finally:
        stop.set()
        supervisor.stop()
    assert distinct > 1000
    worker_logs = "".join(p.read_text() for p in (tmp_path / "run" / "logs").glob("*.log"))
    # Before the totals: if no worker ran there is no state topic to read them from, and that
    # read's timeout would hide the worker logs that say why.
    assert len(processed) >= distinct, f"{len(processed)} of {distinct} events processed; worker logs:\n{worker_logs}"
    counts = read_counts(plain, topic_name, consumer.group_id, covering=len(log))
    check_all(log, list(processed), counts, ledger=True)
    assert len(processed) == distinct
    assert "Traceback" not in worker_logs


def test_the_aggregation_reads_over_tls_and_scram_with_spark_s_connector(spark, secure_kafka: SecureKafka,
                                                                          topic_name: str, tmp_path: Path) -> None:
    # Written through PLAINTEXT; the job must read through the secure listener, where the librdkafka
    # names of the client properties reach the Java client translated (a JAAS line, a PEM truststore).
    make_topic(secure_kafka.cluster.bootstrap, topic_name, 2)
    records = processed_records(600, clients=20, seed=3)
    produce_processed(secure_kafka.cluster.bootstrap, topic_name, records, 2)
    summary = run_once(secure_kafka.secure_bootstrap, topic_name, str(tmp_path / "out"), spark=spark,
                       client_properties=secure_kafka.client_properties())
    assert summary.records_read == summary.aggregated == len(records)
