"""Leader election by a Kubernetes Lease (coordination.k8s.io/v1), the way client-go's
leaderelection package (and so the Flink, Strimzi and Spark operators) does it.

Only the holder runs range controllers and answers the alert webhook; kopf's peering is not
fencing (two replicas may both act while peering settles). The holder renews every
`retry_seconds`; a candidate takes the Lease only after the record it observed has not changed for
`lease_seconds`, measured on its own clock (no trust in other nodes' clocks). A holder that has not
renewed for `renew_deadline_seconds` stops its controllers and gives up. Because the renew
deadline is shorter than the lease, a holder that loses the Lease has stopped its controllers
before any other replica can start its own. Updates carry the resourceVersion read, so two
candidates never both win one round (the API server answers the loser 409).

That only holds if no call outlives the deadline: on a network that drops packets silently a call
hangs until its timeout. So while holding, every call ends by `act_until` (the start of the last
successful round plus the renew deadline): the Lease's own calls get what is left of it, and the
operator bounds every other API call by it too (`Kube.deadline`).

`LeaseElector` does the Kubernetes calls; `may_acquire` is the pure decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from keyrange.operator.kube import Kube, KubeApiError

log = logging.getLogger(__name__)
LEASE_API = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaseTimings:
    """How long a Lease lasts and how often it is renewed (client-go's defaults)."""

    lease_seconds: float = 15.0
    """A candidate takes over a Lease whose record has not changed for this long."""
    renew_deadline_seconds: float = 10.0
    """The holder gives up (stops its controllers) if it could not renew for this long."""
    retry_seconds: float = 2.0
    """How often the holder renews and a candidate retries."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError("lease timings need 0 < retry < renew deadline < lease duration, got "
                             f"{self.retry_seconds}, {self.renew_deadline_seconds}, {self.lease_seconds}")


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says about its holder."""

    holder: str
    """holderIdentity ("" when released)."""
    lease_seconds: float
    """leaseDurationSeconds the holder asked for."""
    renew_time: str
    """renewTime as written (compared only for change, never as a clock)."""
    transitions: int
    """leaseTransitions: how many times the holder changed."""

    @classmethod
    def of(cls, lease: dict[str, Any]) -> LeaseRecord:
        """The record of a stored Lease object."""
        spec = lease.get("spec") or {}
        return cls(str(spec.get("holderIdentity") or ""), float(spec.get("leaseDurationSeconds") or 0),
                   str(spec.get("renewTime") or ""), int(spec.get("leaseTransitions") or 0))


def may_acquire(record: LeaseRecord | None, unchanged_for: float, identity: str) -> bool:
    """Whether `identity` may write itself as holder: no Lease yet, a released one, its own, or one
    whose record has not changed for its whole duration (its holder is gone)."""
    if record is None or not record.holder or record.holder == identity:
        return True
    return unchanged_for >= record.lease_seconds


def _micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Campaigns for one Lease and holds it (blocking calls: run it in a thread)."""

    def __init__(self, kube: Kube, namespace: str, name: str, identity: str,
                 timings: LeaseTimings = LeaseTimings(), clock: Callable[[], float] = time.monotonic) -> None:
        self._kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.timings = timings
        self._clock = clock
        self._observed: tuple[LeaseRecord, float] | None = None
        """The last record read and when (our clock) it was first seen unchanged."""
        self._renewed_at: float | None = None
        """When (our clock) the last round that wrote this replica as holder started."""

    def act_until(self) -> float | None:
        """The time (this elector's clock) by which every call made as leader must have ended: the
        start of the last successful round plus the renew deadline, before any standby can take
        over; None while not holding."""
        if self._renewed_at is None:
            return None
        return self._renewed_at + self.timings.renew_deadline_seconds

    def _time_left(self) -> float | None:
        """The timeout of the next call: what is left before `act_until` (None: not holding)."""
        until = self.act_until()
        return None if until is None else max(0.0, until - self._clock())

    def _lease(self, found: dict[str, Any] | None) -> dict[str, Any]:
        """The Lease with this replica as holder, keeping what else the stored one says (its labels,
        and the acquire time while the holder does not change)."""
        record = LeaseRecord.of(found) if found else LeaseRecord("", 0, "", 0)
        now = _micro_time(datetime.now(UTC))
        ours = record.holder == self.identity
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.timings.lease_seconds),
                "renewTime": now, "leaseTransitions": record.transitions + (0 if ours or not record.holder else 1),
                "acquireTime": ((found or {}).get("spec") or {}).get("acquireTime") if ours else now}
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if found is not None:
            stored = found["metadata"]
            meta["resourceVersion"] = stored["resourceVersion"]
            meta.update({k: stored[k] for k in ("labels", "annotations") if k in stored})
        return {"apiVersion": LEASE_API, "kind": "Lease", "metadata": meta, "spec": spec}

    def try_acquire_or_renew(self) -> bool:
        """One round: True if this replica holds the Lease afterwards."""
        began = self._clock()
        found = self._kube.get(LEASE_API, "Lease", self.namespace, self.name, timeout_seconds=self._time_left())
        if found is None:
            try:
                self._kube.create(self._lease(None), timeout_seconds=self._time_left())
            except KubeApiError as exc:
                if exc.status == 409:  # another candidate created it first
                    return False
                raise
            self._renewed_at = began
            return True
        record = LeaseRecord.of(found)
        now = self._clock()
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, now)
        if not may_acquire(record, now - self._observed[1], self.identity):
            self._renewed_at = None
            return False
        try:
            self._kube.replace(self._lease(found), timeout_seconds=self._time_left())
        except KubeApiError as exc:
            if exc.status == 409:  # someone else wrote it since we read it
                return False
            raise
        # The standby's wait starts no earlier than this write, which came after `began`.
        self._renewed_at = began
        return True

    def release(self) -> None:
        """Give the Lease up at once (on shutdown), so a standby need not wait out its duration."""
        try:
            found = self._kube.get(LEASE_API, "Lease", self.namespace, self.name, timeout_seconds=self._time_left())
            if found is None or LeaseRecord.of(found).holder != self.identity:
                return
            lease = self._lease(found)
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1)
            self._kube.replace(lease, timeout_seconds=self._time_left())
        except Exception as exc:  # noqa: BLE001 - the Lease then expires on its own
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)
        finally:
            self._renewed_at = None

    def _round(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception as exc:  # noqa: BLE001 (unreachable or refused, whatever the cause: not holding)
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def campaign(self, stop: threading.Event) -> bool:
        """Block until this replica holds the Lease (True) or `stop` is set (False)."""
        while not stop.is_set():
            if self._round():
                log.info("acquired Lease %s/%s as %s", self.namespace, self.name, self.identity)
                return True
            stop.wait(self.timings.retry_seconds)
        return False

    def hold(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew until `stop` is set (then release) or renewing fails until `act_until` (then call
        `on_lost`, which must stop every controller before returning). Each renew's calls end by
        `act_until`, so a renew hanging on a silent network cannot hold the stop back."""
        while True:
            until = self.act_until()
            left = 0.0 if until is None else until - self._clock()
            if left <= 0:
                log.error("lost Lease %s/%s: not renewed within the renew deadline (%.1f s); stopping controllers",
                          self.namespace, self.name, self.timings.renew_deadline_seconds)
                self._renewed_at = None
                on_lost()
                return
            if stop.wait(min(self.timings.retry_seconds, left)):
                break
            self._round()
        self.release()
