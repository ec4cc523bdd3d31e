"""Deleting a StreamConsumer while the operator's periodic refresh is running for it: the real kopf
operator against the real API server. The refresh is held on purpose by a stand-in range control
until the deletion closes it (the real control is slow only by chance, on a loaded machine, which
is when the suite first met this): kopf waits for a running timer before it removes its finalizer,
and the deletion must follow within seconds of the refresh returning, not at kopf's next poll of
an exiting timer, a minute later by default."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from keyrange.operator.rangecontrol import PlannedRescale, RangeStatus
from keyrange.ranges.planner import Direction, ScaleOutcome
from keyrange.spec import StreamConsumerSpec
from tests.operator.conftest import SC_PATH, Api, Release, admin_api, create_namespace, eventually, running_operator

NS = "delete-during-refresh"
SC = SC_PATH.format(ns=NS)

HOLD_LIMIT_SECONDS = 120.0
"""A held refresh returns by itself after this, should the deletion never close the control."""
DELETED_WITHIN_SECONDS = 30.0
"""Far above what deleting takes, far below kopf's default 60 s poll of a timer that is exiting."""


class HeldControl:
    """A range control whose `desired_workers` (called by every refresh) blocks, once `hold` is set,
    until the control is closed (the deletion's `forget` closes it); `entered` tells the test that a
    refresh is inside it."""

    def __init__(self, spec: StreamConsumerSpec) -> None:
        self.spec = spec
        self.hold, self.entered, self.released = threading.Event(), threading.Event(), threading.Event()

    def desired_workers(self) -> int:
        if self.hold.is_set():
            self.entered.set()
            self.released.wait(timeout=HOLD_LIMIT_SECONDS)
        return self.spec.workers.min

    def workers_available(self, ready: int) -> None:
        pass

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        return ScaleOutcome(False, "not under test", self.spec.workers.min, self.spec.workers.min)

    def update_spec(self, spec: StreamConsumerSpec) -> None:
        self.spec = spec

    def status(self) -> RangeStatus:
        return RangeStatus(epoch=1, workers=self.spec.workers.min)

    def take_decisions(self) -> list[PlannedRescale]:
        return []

    def close(self) -> None:
        self.released.set()


@pytest_asyncio.fixture
async def cluster(release: Release) -> AsyncIterator[Api]:
    create_namespace(release.plane, NS)
    async with admin_api(release.plane, "kafka:9092", "events") as api:
        yield api.in_namespace(NS)


async def test_a_consumer_deleted_during_a_refresh_is_gone_soon_after_the_refresh_returns(
        cluster: Api, release: Release) -> None:
    controls: list[HeldControl] = []

    def factory(namespace: str, name: str, spec: StreamConsumerSpec) -> HeldControl:
        controls.append(HeldControl(spec))
        return controls[-1]

    async with running_operator(release, [NS], range_control_factory=factory):
        body: dict[str, Any] = {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
                                "metadata": {"name": "held", "namespace": NS},
                                "spec": {"kafka": {"topic": "events", "bootstrapServers": "kafka:9092"}}}
        await cluster.create(SC, body)
        await eventually(lambda: asyncio.sleep(0, controls or None), "a range control")
        control = controls[-1]
        control.hold.set()
        assert await asyncio.to_thread(control.entered.wait, 60), "no refresh reached the range control"
        loop = asyncio.get_running_loop()
        deleted_at = loop.time()
        await cluster.delete(f"{SC}/held")

        async def gone() -> bool:
            return await cluster.get(f"{SC}/held") is None

        await eventually(gone, "the StreamConsumer to be deleted", timeout=DELETED_WITHIN_SECONDS)
        assert control.released.is_set() and loop.time() - deleted_at < DELETED_WITHIN_SECONDS
