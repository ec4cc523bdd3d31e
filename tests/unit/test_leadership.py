"""Lease leader election with an injected clock and an in-memory Lease store (the real API server
and real processes: tests/operator/test_command.py)."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest

from keyrange.operator.kube import KubeApiError
from keyrange.operator.leadership import LeaseElector, LeaseRecord, LeaseTimings, may_acquire

TIMINGS = LeaseTimings(lease_seconds=15, renew_deadline_seconds=10, retry_seconds=2)


class Leases:
    """get / create / replace of one Lease with resourceVersion checks, as the API server does."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    def _check(self, timeout_seconds: float | None) -> None:
        if self.down:
            raise KubeApiError(503, "GET", "/leases", b"unavailable")

    def get(self, api_version: str, kind: str, namespace: str, name: str,
            timeout_seconds: float | None = None) -> dict[str, Any] | None:
        self._check(timeout_seconds)
        return copy.deepcopy(self.stored)

    def create(self, obj: dict[str, Any], timeout_seconds: float | None = None) -> dict[str, Any]:
        self._check(timeout_seconds)
        if self.stored is not None:
            raise KubeApiError(409, "POST", "/leases", b"exists")
        return self._store(obj)

    def replace(self, obj: dict[str, Any], timeout_seconds: float | None = None) -> dict[str, Any]:
        self._check(timeout_seconds)
        assert self.stored is not None
        if obj["metadata"].get("resourceVersion") != self.stored["metadata"]["resourceVersion"]:
            raise KubeApiError(409, "PUT", "/leases", b"conflict")
        return self._store(obj)

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.stored = copy.deepcopy(obj)
        self.stored["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.stored)

    @property
    def holder(self) -> str:
        return LeaseRecord.of(self.stored or {}).holder


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _elector(leases: Leases, identity: str, clock: Clock) -> LeaseElector:
    return LeaseElector(leases, "ns", "keyrange", identity, TIMINGS, clock=clock)  # type: ignore[arg-type]


def test_may_acquire_a_free_own_or_expired_lease_only() -> None:
    held = LeaseRecord("a", 15, "t1", 0)
    assert may_acquire(None, 0, "b")
    assert may_acquire(LeaseRecord("", 1, "t", 3), 0, "b")
    assert may_acquire(held, 0, "a")
    assert not may_acquire(held, 14.9, "b")
    assert may_acquire(held, 15, "b")


def test_timings_must_leave_the_holder_time_to_stop_before_the_lease_expires() -> None:
    for bad in ((2, 15, 10), (0, 5, 15), (5, 5, 15)):
        with pytest.raises(ValueError, match="retry < renew deadline < lease duration"):
            LeaseTimings(retry_seconds=bad[0], renew_deadline_seconds=bad[1], lease_seconds=bad[2])


def test_a_standby_takes_over_only_after_the_record_stayed_unchanged_for_the_lease_duration() -> None:
    leases, clock = Leases(), Clock()
    a, b = _elector(leases, "a", clock), _elector(leases, "b", clock)
    assert a.try_acquire_or_renew() and leases.holder == "a"
    assert not b.try_acquire_or_renew()  # b starts observing now
    clock.now = 10
    assert a.try_acquire_or_renew()  # a renews: the record changes (b has not looked yet)
    clock.now = 24
    assert not b.try_acquire_or_renew()  # b sees the renewed record now: its wait starts again
    clock.now = 38.9
    assert not b.try_acquire_or_renew()
    clock.now = 39
    assert b.try_acquire_or_renew() and leases.holder == "b"
    assert LeaseRecord.of(leases.stored or {}).transitions == 1
    assert not a.try_acquire_or_renew()  # a sees b's fresh record


def test_renewing_keeps_the_acquire_time_and_the_stored_labels() -> None:
    leases, clock = Leases(), Clock()
    leases.stored = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": "keyrange", "namespace": "ns", "resourceVersion": "0",
                                  "labels": {"app.kubernetes.io/part-of": "keyrange"}}, "spec": {}}
    a = _elector(leases, "a", clock)
    assert a.try_acquire_or_renew()
    acquired = (leases.stored or {})["spec"]["acquireTime"]
    assert a.try_acquire_or_renew()
    stored = leases.stored or {}
    assert stored["spec"]["acquireTime"] == acquired
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/part-of": "keyrange"}


def test_a_holder_that_cannot_renew_stops_at_the_deadline_before_the_lease_ends() -> None:
    leases, clock = Leases(), Clock()
    a = _elector(leases, "a", clock)
    assert a.try_acquire_or_renew()
    lost_at: list[float] = []
    stop = threading.Event()

    def wait(seconds: float) -> bool:  # the retry period passes on the fake clock
        clock.now += seconds
        return stop.is_set()

    stop.wait = wait  # type: ignore[method-assign]
    leases.down = True
    a.hold(stop, lambda: lost_at.append(clock.now))
    assert lost_at == [10.0]  # the renew deadline, before the 15 s lease could expire for anyone


def test_release_frees_the_lease_for_a_standby_at_once() -> None:
    leases, clock = Leases(), Clock()
    a, b = _elector(leases, "a", clock), _elector(leases, "b", clock)
    assert a.try_acquire_or_renew()
    a.release()
    assert leases.holder == ""
    assert b.try_acquire_or_renew() and leases.holder == "b"


class Blackholed(Leases):
    """Leases behind a network that drops packets silently: every call hangs until its timeout
    (on the fake clock), then fails; a call without a timeout hangs for the client's default 30 s."""

    DEFAULT_TIMEOUT_SECONDS = 30.0

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.blackholed = False
        self.timeouts: list[float | None] = []

    def _check(self, timeout_seconds: float | None) -> None:
        self.timeouts.append(timeout_seconds)
        if self.blackholed:
            self.clock.now += self.DEFAULT_TIMEOUT_SECONDS if timeout_seconds is None else max(0.0, timeout_seconds)
            raise TimeoutError("read timed out")


def _fake_waits(stop: threading.Event, clock: Clock) -> None:
    def wait(seconds: float | None = None) -> bool:  # the retry period passes on the fake clock
        clock.now += seconds or 0.0
        return stop.is_set()

    stop.wait = wait  # type: ignore[method-assign]


def test_a_holder_whose_calls_hang_on_a_blackholed_network_still_stops_at_the_renew_deadline() -> None:
    clock = Clock()
    leases = Blackholed(clock)
    a = _elector(leases, "a", clock)
    clock.now = 1.0
    assert a.try_acquire_or_renew()
    stop, lost_at = threading.Event(), []
    _fake_waits(stop, clock)
    leases.blackholed = True  # a renew sent now hangs: it must not outlive the renew deadline
    acquiring = len(leases.timeouts)
    a.hold(stop, lambda: lost_at.append(clock.now))
    # Renewed by the round that started at 1.0: controllers stop by 11.0, before a standby that saw
    # that record may take over (at 16.0 at the earliest).
    assert lost_at and lost_at[0] <= 1.0 + TIMINGS.renew_deadline_seconds, lost_at
    held = leases.timeouts[acquiring:]
    assert held and all(t is not None and t <= TIMINGS.renew_deadline_seconds for t in held), leases.timeouts


def test_while_holding_no_call_may_outlast_the_renew_deadline() -> None:
    clock = Clock()
    leases = Blackholed(clock)
    a = _elector(leases, "a", clock)
    assert a.act_until() is None  # not holding: nothing to bound
    clock.now = 5.0
    assert a.try_acquire_or_renew()
    assert a.act_until() == 5.0 + TIMINGS.renew_deadline_seconds
    clock.now = 8.0
    assert a.try_acquire_or_renew()  # renewed by a round that started at 8.0
    assert a.act_until() == 18.0
