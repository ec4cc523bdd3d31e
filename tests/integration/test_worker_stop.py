"""A worker's graceful stop when part of it fails: the failure is logged with its cause, and the
rest of the stop still runs (no error of a stop vanishes, none stops it half-way)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

import pytest

from keyrange.handlers import load_handler
from keyrange.worker import Worker
from keyrange.worker.transactions import TransactionFailed
from tests.integration.worker_helpers import produce_stream, settings_for, wait_for


async def test_a_release_error_during_stop_is_logged_and_the_stop_completes(
        bootstrap: str, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    produce_stream(bootstrap, topic_name, 200, partitions=2)
    worker = Worker(settings_for(bootstrap, topic_name), load_handler("noop"))
    await worker.start()
    await worker.acquire([0, 1])
    await wait_for(lambda: worker.stats.processed >= 200, what="the stream to be handled")
    release = worker.release

    async def failing_release(slots: Collection[int], commit: bool = True) -> None:
        await release(slots, commit)
        raise TransactionFailed("slot 0's producer was fenced")

    worker.release = failing_release  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="keyrange.worker.engine"):
        await asyncio.wait_for(worker.stop(), 60)
    failures = [r for r in caplog.records if r.exc_info and "producer was fenced" in str(r.exc_info[1])]
    assert failures, f"the release error was not logged: {caplog.text!r}"
    assert "stop" in failures[0].getMessage()
    await asyncio.wait_for(worker.wait(), 10)  # the stop ran to its end
