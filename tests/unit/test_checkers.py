"""The shared guarantee checkers fail on what they guard, and check_all names every failure at once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.checkers import Counts, LoggedEvent, check_all, check_no_duplicates, check_no_loss, check_order_per_client


def event(offset: int, client: int, uuid: str) -> LoggedEvent:
    return LoggedEvent(0, offset, client, uuid, {"clientId": client, "uuid": uuid, "op": "increment", "amount": 1})


def handled(e: LoggedEvent, started: int, value: int) -> dict[str, Any]:
    return {"clientId": e.client_id, "uuid": e.uuid, "startedAt": started, "finishedAt": started + 1,
            "result": {"value": value, "returned": value}, "partition": e.partition, "offset": e.offset}


LOG = [event(0, 1, "a"), event(1, 1, "b"), event(2, 2, "c"), event(3, 1, "a")]
"""Client 1: a, b, then a duplicate of a; client 2: c."""
RIGHT = [handled(LOG[0], 10, 1), handled(LOG[1], 20, 2), handled(LOG[2], 10, 1)]


def test_a_right_run_passes_every_check() -> None:
    check_all(LOG, RIGHT, Counts(handled=3, dead_lettered=0, duplicates_dropped=1), ledger=True)


def test_each_checker_fails_on_what_it_guards() -> None:
    with pytest.raises(AssertionError, match="1 of 3 events were lost"):
        check_no_loss(LOG, RIGHT[:2])
    with pytest.raises(AssertionError, match="handled more than once"):
        check_no_duplicates([*RIGHT, RIGHT[0]])
    with pytest.raises(AssertionError, match="overlapped or ran out of log order"):
        check_order_per_client(LOG, [handled(LOG[0], 20, 1), handled(LOG[1], 10, 2), RIGHT[2]])


def test_check_all_names_every_failure_at_once() -> None:
    """A loss with the counts beside it: here counted as handled though its output is missing."""
    with pytest.raises(AssertionError) as failed:
        check_all(LOG, RIGHT[:2], Counts(handled=3, dead_lettered=0, duplicates_dropped=2), ledger=True)
    message = str(failed.value)
    assert "1 of 3 events were lost" in message
    assert "2 duplicates dropped, but the input holds 1" in message


def test_an_output_of_no_input_event_is_reported_not_a_crash() -> None:
    stray = {**RIGHT[0], "uuid": "z"}
    with pytest.raises(AssertionError, match="1 processed uuids are not in the input"):
        check_all(LOG, [*RIGHT, stray], Counts(handled=3, dead_lettered=0, duplicates_dropped=1), ledger=True)
