"""`keyrange worker` as a real subprocess: SIGKILL mid-stream and restart (on tansu and on Apache Kafka),
SIGTERM, errors, metrics."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import make_producer
from keyrange.local.ports import free_port
from tests.checkers import check_all, first_occurrences
from tests.integration.worker_cli_helpers import PARTITIONS, REPO, metric_sum, repo_env, start, wait, worker_command
from tests.integration.worker_helpers import produce_stream
from tests.kafkatools import log_ends, offsets_committed_so_far, read_counts, read_input_log, read_processed


def committed_all(bootstrap: str, topic: str, ends: dict[int, int]) -> bool:
    found = offsets_committed_so_far(bootstrap, topic, f"{topic}-g", ends)
    return all(offset >= ends[p] for p, offset in found.items())


@pytest.mark.slow
def test_sigkill_then_restart_loses_nothing_and_reruns_nothing(any_bootstrap: str, topic_name: str,
                                                               tmp_path: Path) -> None:
    bootstrap = any_bootstrap
    sent = produce_stream(bootstrap, topic_name, 4000, PARTITIONS, clients=120, duplicate_ratio=0.03, ledger=True)
    log = read_input_log(bootstrap, topic_name, sent)
    distinct = len(first_occurrences(log))
    port = free_port()
    log_path = tmp_path / "worker.log"
    command = worker_command(bootstrap, topic_name, port)

    first = start(command, log_path)
    try:
        wait(lambda: metric_sum(port, "keyrange_events_processed_total") >= 1000, "1000 events processed",
             proc=first, log_path=log_path)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    killed_at = metric_sum(port, "keyrange_events_processed_total")
    assert killed_at == -1.0  # really gone

    port = free_port()
    second = start(worker_command(bootstrap, topic_name, port), log_path)
    try:
        wait(lambda: committed_all(bootstrap, topic_name, log_ends(log, range(PARTITIONS))),
             "all offsets committed after restart", proc=second, log_path=log_path)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, log_path.read_text()
    text = log_path.read_text()
    assert "final: processed" in text
    # The restart found events finished after the killed worker's last commit (events finish out
    # of order), so the skip path, not just the committed offsets, kept them from running twice.
    restored = re.findall(r"restored (\d+) finished-after-commit offsets", text)
    assert len(restored) == 2 and int(restored[1]) > 0, text
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct)
    # No loss, no event handled twice (the restart skipped what the killed worker had committed
    # and the outputs it had written past its last committed offset), ledger equals the oracle.
    # The totals committed with the offsets are exact across the SIGKILL too.
    check_all(log, processed, read_counts(bootstrap, topic_name, f"{topic_name}-g"), ledger=True)

    # A third run: duplicates of events handled before the restart are still dropped (the
    # dedup window was rebuilt from the log), and new events are handled.
    producer = make_producer(bootstrap)
    originals = [e for e in first_occurrences(log)][-50:]
    for e in originals:
        producer.produce(topic_name, orjson_dumps(e.body), str(e.client_id).encode(), timestamp=e.body["created"])
    assert producer.flush(30) == 0
    extra = produce_stream(bootstrap, topic_name, 20, PARTITIONS, clients=10, duplicate_ratio=0.0, ledger=True,
                           seed=99)
    log2 = read_input_log(bootstrap, topic_name, sent + len(originals) + extra)
    port = free_port()
    third = start(worker_command(bootstrap, topic_name, port), log_path)
    try:
        wait(lambda: committed_all(bootstrap, topic_name, log_ends(log2, range(PARTITIONS))),
             "the third run to commit everything", proc=third, log_path=log_path)
        dropped = metric_sum(port, "keyrange_duplicates_dropped_total")
    finally:
        third.send_signal(signal.SIGTERM)
        assert third.wait(60) == 0, log_path.read_text()
    assert dropped == len(originals)
    processed = read_processed(bootstrap, f"{topic_name}.processed", distinct + extra)
    check_all(log2, processed, read_counts(bootstrap, topic_name, f"{topic_name}-g"), ledger=True)


def orjson_dumps(body: object) -> bytes:
    import orjson

    return orjson.dumps(body)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = repo_env()
    return subprocess.run([sys.executable, "-m", "keyrange.cli", "worker", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


def test_a_spec_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "consumer.yaml"
    path.write_bytes(b"apiVersion: keyrange.dev/v1alpha1\nkind: StreamConsumer\nmetadata: {name: p}\n"
                     b"spec:\n  kafka: {topic: caf\xc3}\n")
    result = run_cli("--spec-file", str(path), "--partitions", "0")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"keyrange worker: error: {path} is not UTF-8 text: byte 0xc3 at offset 101 (line 5, column 21): "
        "invalid continuation byte; save the file as UTF-8"]


def test_cli_errors_are_one_clear_line(bootstrap: str, topic_name: str) -> None:
    ensure_topics(bootstrap, [TopicSpec(topic_name, 4)])
    base = ["--bootstrap", bootstrap, "--group", "g", "--summary-seconds", "0"]
    cases = {
        "does not exist": [*base, "--topic", f"{topic_name}-missing", "--partitions", "0-3"],
        "has 4 partitions but --partitions asks for 0-11": [*base, "--topic", topic_name, "--partitions", "0-11"],
        "cannot import handler module 'no_such_module'": [*base, "--topic", topic_name, "--partitions", "0",
                                                          "--handler", "no_such_module:handle"],
        "bad handlerConfig for the 'sleep' handler": [*base, "--topic", topic_name, "--partitions", "0",
                                                      "--handler-config", '{"meanMs": -1}'],
        "--handler-config is not valid JSON": [*base, "--topic", topic_name, "--partitions", "0",
                                               "--handler-config", "{nope"],
        "--partitions: bad slot list": [*base, "--topic", topic_name, "--partitions", "3-1"],
        "must differ from the input topic": [*base, "--topic", topic_name, "--partitions", "0",
                                             "--dlq-topic", topic_name],
        "--metrics-fd 99 is not an open socket": [*base, "--topic", topic_name, "--partitions", "0",
                                                  "--metrics-fd", "99"],
    }
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        cases[f"cannot serve metrics on port {port}: Address already in use"] = [
            *base, "--topic", topic_name, "--partitions", "0", "--metrics-port", str(port)]
        for expected, args in cases.items():
            result = run_cli(*args)
            assert result.returncode == 2, (expected, result.stderr)
            lines = [line for line in result.stderr.splitlines() if line.startswith("keyrange worker: error:")]
            assert len(lines) == 1 and expected in lines[0], (expected, result.stderr)
            assert "Traceback" not in result.stderr
            assert "never awaited" not in result.stderr, (expected, result.stderr)  # a stop right after the start
