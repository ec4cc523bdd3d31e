"""The CLI's contract for user mistakes: one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from keyrange.cli import main


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_produce_rejects_a_bad_duplicate_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["produce", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--count", "1",
                 "--duplicate-ratio", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("keyrange produce: error: duplicate ratio must be between 0 and 1")
    assert "Traceback" not in err


def test_broker_command_prints_its_address_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "keyrange.cli", "broker", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:")
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
