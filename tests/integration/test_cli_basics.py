"""The CLI's contract for user mistakes: one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from keyrange.cli import main


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "message"), [
    (["--count", "1", "--duplicate-ratio", "2"], "--duplicate-ratio 2 is out of range: a share from 0 to 1"),
    (["--count", "1", "--rate", "-5"], "--rate -5 is out of range: events per second above 0"),
    (["--count", "1", "--clients", "0"], "--clients 0 is out of range: at least 1"),
    (["--count", "0"], "--count 0 is out of range: at least 1"),
    (["--duration", "0"], "--duration 0 is out of range: seconds above 0"),
    (["--count", "1", "--partitions", "0"], "--partitions 0 is out of range: at least 1"),
])
def test_produce_names_the_option_out_of_range_before_reaching_kafka(
        capsys: pytest.CaptureFixture[str], options: list[str], message: str) -> None:
    code = main(["produce", "--bootstrap", "127.0.0.1:1", "--topic", "t", *options])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"keyrange produce: error: {message}"


def test_operator_says_when_its_metrics_port_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        code = main(["operator", "--metrics-port", str(port)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"keyrange operator: error: cannot serve metrics on port {port}: Address already in use")
    assert "Traceback" not in err


def test_operator_says_when_its_metrics_fd_is_not_a_socket(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with (tmp_path / "not-a-socket").open("w") as file:
        fd = file.fileno()
        code = main(["operator", "--metrics-fd", str(fd)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"keyrange operator: error: --metrics-fd {fd} is not an open socket: ")
    assert "Traceback" not in err


def test_operator_takes_a_metrics_port_or_fd_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["operator", "--metrics-port", "9090", "--metrics-fd", "3"])
    assert info.value.code == 2
    assert "--metrics-fd: not allowed with argument --metrics-port" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--liveness-fd", "--webhook-fd"])
def test_operator_says_when_a_listener_fd_is_not_a_socket(
        option: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with (tmp_path / "not-a-socket").open("w") as file:
        fd = file.fileno()
        code = main(["operator", option, str(fd)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"keyrange operator: error: {option} {fd} is not an open socket: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(("what", "options"), [
    ("health", ["--liveness=http://127.0.0.1:{port}/healthz"]),
    ("the alert webhook", ["--liveness=", "--webhook-port={port}"]),
])
def test_operator_says_when_a_listener_port_is_taken(
        what: str, options: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        code = main(["operator", "--metrics-port=0", *(o.format(port=port) for o in options)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"keyrange operator: error: cannot serve {what} on port {port}: Address already in use")
    assert "Traceback" not in err


@pytest.mark.parametrize(("port_option", "fd_option"), [("--liveness=http://127.0.0.1:8080/healthz", "--liveness-fd"),
                                                        ("--webhook-port=8081", "--webhook-fd")])
def test_operator_takes_a_listener_port_or_fd_not_both(
        port_option: str, fd_option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["operator", port_option, fd_option, "3"])
    assert info.value.code == 2
    port_name = port_option.split("=")[0]
    assert f"{fd_option}: not allowed with argument {port_name}" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "message"), [
    (["--concurrency", "0"], "--concurrency must be at least 1, got 0"),
    (["--max-pending", "-1"], "--max-pending must be at least 1, got -1"),
    (["--commit-interval-ms", "0"], "--commit-interval-ms must be at least 1, got 0"),
    (["--summary-seconds", "-1"], "--summary-seconds must be 0 (no summary) or more, got -1"),
    (["--metrics-port", "70000"], "cannot serve metrics on port 70000: a TCP port is 0-65535"),
])
def test_worker_names_the_flag_of_a_value_out_of_range_before_reaching_kafka(
        capsys: pytest.CaptureFixture[str], options: list[str], message: str) -> None:
    code = main(["worker", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--group", "g", "--partitions", "0", *options])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"keyrange worker: error: {message}"


@pytest.mark.parametrize(("options", "message"), [
    (["--refresh-seconds", "0"], "invalid operator setting: --refresh-seconds must be > 0"),
    (["--termination-grace-seconds", "0"], "invalid operator setting: --termination-grace-seconds must be >= 1"),
    (["--lease-renew-deadline-seconds", "100"],
     "invalid lease timings (--lease-retry-seconds, --lease-renew-deadline-seconds, --lease-seconds): lease timings "
     "need 0 < retry < renew deadline < lease duration, got 2.0, 100.0, 15.0"),
])
def test_operator_names_the_flag_of_a_bad_setting_before_reaching_the_api_server(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, options: list[str], message: str) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")  # reaching it would fail differently
    code = main(["operator", *options])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"keyrange operator: error: {message}"


def test_worker_with_a_spec_file_without_bootstrap_servers_says_to_give_bootstrap(
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = Path(__file__).resolve().parents[2] / "examples" / "streamconsumer.yaml"
    code = main(["worker", "--spec-file", str(spec), "--partitions", "0"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (f"keyrange worker: error: {spec} has no spec.kafka.bootstrapServers: "
                                               "give --bootstrap")
