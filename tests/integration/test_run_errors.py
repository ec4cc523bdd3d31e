"""`keyrange run` on a bad StreamConsumer: exit 2 and a message naming the problem, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GOOD = """apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {name: payments}
spec:
  kafka: {topic: payments}
"""

CASES = {
    "not-yaml": ("spec: [unclosed", "is not valid YAML"),
    "wrong-kind": (GOOD.replace("kind: StreamConsumer", "kind: Deployment"), "expected exactly one StreamConsumer"),
    "bad-api-version": (GOOD.replace("v1alpha1", "v9"), "expected apiVersion: keyrange.dev/v1alpha1"),
    "bad-field": (GOOD + "  concurrency: 0\n", "spec.concurrency: Input should be greater than or equal to 1"),
    "unknown-field": (GOOD + "  concurency: 8\n", "spec.concurency: Extra inputs are not permitted"),
    "bad-bounds": (GOOD + "  workers: {min: 5, max: 2}\n", "workers.min (5) must not exceed workers.max (2)"),
    "dlq-is-input": (GOOD + "  deadLetterTopic: payments\n", "deadLetterTopic is 'payments', the input topic"),
    "sink-is-input": (GOOD + "  sink: {topic: payments}\n", "sink.topic is 'payments', the input topic"),
    "bad-input-mapping": (GOOD + "  input: {uuid: key}\n",
                          "spec.input.uuid: 'key' is not a uuid mapping: field:<name>, header:<name> or none"),
    "raw-with-fields": (GOOD + "  input: {format: raw}\n", "input.format raw hands the value's bytes to the handler"),
    "missing-decoder": (GOOD + "  input: {format: 'no_such_decoders:decode'}\n",
                        "spec.input.format 'no_such_decoders:decode': cannot import module 'no_such_decoders'"),
}


def run_keyrange(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "keyrange.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("case", CASES)
def test_bad_yaml_exits_2_with_a_clear_message(case: str, tmp_path: Path) -> None:
    text, expected = CASES[case]
    path = tmp_path / "consumer.yaml"
    path.write_text(text)
    result = run_keyrange("-f", str(path), "--duration", "1")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith("keyrange run: error: ") and str(path) in first_line
    assert expected in result.stderr


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    result = run_keyrange("-f", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"keyrange run: error: cannot read {tmp_path / 'nope.yaml'}: "
                                                  "No such file or directory"]


@pytest.mark.parametrize(("options", "message"), [
    (["--produce", "-5"], "--produce must be a positive rate, got -5.0"),
    (["--ledger"], "--ledger shapes the load that --produce writes: add --produce RATE, or drop --ledger"),
    (["--ledger", "--clients", "5"],
     "--ledger and --clients shape the load that --produce writes: add --produce RATE, or drop --ledger and --clients"),
    (["--produce", "10", "--clients", "0"], "--clients must be at least 1, got 0"),
    (["--webhook-port", "70000", "--webhook-token", "t"], "--webhook-port must be a TCP port (0-65535), got 70000"),
    (["--webhook-port", "0"], "the alert webhook needs a bearer token: pass --webhook-token, or set "
                              "KEYRANGE_WEBHOOK_TOKEN (or KEYRANGE_WEBHOOK_TOKEN_FILE to a file holding it); "
                              "Alertmanager sends the same one"),
])
def test_bad_options_are_rejected_before_starting_anything(tmp_path: Path, options: list[str], message: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEYRANGE_WEBHOOK_TOKEN", raising=False)
    monkeypatch.delenv("KEYRANGE_WEBHOOK_TOKEN_FILE", raising=False)
    path = tmp_path / "consumer.yaml"
    path.write_text(GOOD)
    result = run_keyrange("-f", str(path), *options)
    assert result.returncode == 2
    assert result.stderr.strip() == f"keyrange run: error: {message}"


def test_a_run_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "consumer.yaml"
    path.write_text(GOOD)
    run_dir = path / "run"  # under a file
    result = run_keyrange("-f", str(path), "--run-dir", str(run_dir), "--duration", "1")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"keyrange run: error: --run-dir {run_dir}: cannot make the folder "
                                     "(Not a directory); pick another --run-dir")


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "consumer.yaml"
    path.write_bytes(GOOD.encode().replace(b"payments}", b"caf\xe9}"))
    result = run_keyrange("-f", str(path), "--duration", "1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"keyrange run: error: {path} is not UTF-8 text: byte 0xe9 at offset 75 (line 3, column 21): "
        "invalid continuation byte; save the file as UTF-8"]


def test_a_handler_that_cannot_be_imported_stops_the_run_at_once(tmp_path: Path) -> None:
    # Workers run `python -m keyrange.cli` in this directory, so they would import it from here too.
    (tmp_path / "payments_handler.py").write_text("raise RuntimeError('PAYMENTS_DSN is not set')\n")
    path = tmp_path / "consumer.yaml"
    path.write_text(GOOD + "  handler: payments_handler:handle\n")
    result = run_keyrange("-f", str(path), "--duration", "20", "--run-dir", str(tmp_path / "run"), cwd=tmp_path,
                          timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [
        "keyrange run: error: handler module 'payments_handler' raised RuntimeError: PAYMENTS_DSN is not set on "
        f"import ({tmp_path / 'payments_handler.py'}, line 1); fix the module or the handler's name"]
    assert "handled" not in result.stdout
    assert not (tmp_path / "run").exists()  # no worker was started


def test_produce_refuses_a_spec_whose_input_it_does_not_write(tmp_path: Path) -> None:
    path = tmp_path / "consumer.yaml"
    path.write_text(GOOD + "  input: {clientId: key, uuid: 'header:id', created: timestamp}\n")
    result = run_keyrange("-f", str(path), "--produce", "10")
    assert result.returncode == 2
    assert result.stderr.startswith("keyrange run: error: --produce writes keyrange's own input format")
    assert "Traceback" not in result.stderr
