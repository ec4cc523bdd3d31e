"""A failed worker test shows the worker's log condensed: CI keeps a few kilobytes of a failure,
and a stalled worker's once-a-second summary must not push the lines that explain it out."""

from tests.integration.worker_cli_helpers import condensed


def test_runs_of_identical_lines_are_shown_once_and_counted() -> None:
    log = "\n".join(["start", "processed 5 (0/s)", "processed 5 (0/s)", "processed 5 (0/s)", "WARNING slot 3",
                     "processed 5 (0/s)", "processed 6 (1/s)", "processed 6 (1/s)"])
    assert condensed(log).splitlines() == [
        "start", "processed 5 (0/s)", "  [the line above 2 more times]", "WARNING slot 3", "processed 5 (0/s)",
        "processed 6 (1/s)", "  [the line above 1 more times]"]


def test_a_log_without_repeats_is_unchanged() -> None:
    assert condensed("a\nb\na") == "a\nb\na"
    assert condensed("") == ""
