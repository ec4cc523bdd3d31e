"""One RangeControl per StreamConsumer, kept for the operator's lifetime.

The registry is shared by the kopf handlers and the alert webhook (which finds a consumer's
control by namespace and name to request a split or merge).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from keyrange.operator.rangecontrol import RangeControl
from keyrange.spec import StreamConsumerSpec

RangeControlFactory = Callable[[str, str, StreamConsumerSpec], RangeControl]
"""(namespace, name, spec) -> the consumer's range control."""


def default_range_control(namespace: str, name: str, spec: StreamConsumerSpec) -> RangeControl:
    """The range control used in a cluster: keyrange's Controller over the Kafka control topic."""
    from keyrange.operator.clusterassigner import KafkaRangeControl

    return KafkaRangeControl(namespace, name, spec)


class ControlRegistry:
    """Range controls by (namespace, name); thread-safe (kopf runs sync handlers in threads)."""

    def __init__(self, factory: RangeControlFactory = default_range_control) -> None:
        self._factory = factory
        self._controls: dict[tuple[str, str], RangeControl] = {}
        self._closed: set[tuple[str, str]] = set()
        self._stopped = False
        self._lock = threading.Lock()
        self._worker_count_locks: dict[tuple[str, str], threading.Lock] = {}

    def ensure(self, namespace: str, name: str, spec: StreamConsumerSpec,
               revive: bool = True) -> RangeControl | None:
        """The consumer's control, created on first use; later calls pass the newest spec on.

        After `close`, only a call with `revive=True` (a create, resume or spec change) starts a
        new one: a periodic refresh already in flight when the consumer was deleted must not.
        """
        key = (namespace, name)
        with self._lock:
            if self._stopped:
                raise NotLeading("this operator replica no longer holds the Lease: it starts no range control")
            control = self._controls.get(key)
            if control is None:
                if key in self._closed and not revive:
                    return None
                self._closed.discard(key)
                control = self._controls[key] = self._factory(namespace, name, spec)
                return control
        control.update_spec(spec)
        return control

    def worker_count_lock(self, namespace: str, name: str) -> threading.Lock:
        """Held by reconcile and by the refresh timer, which kopf runs side by side, while each reads
        the consumer's worker count and writes it to the StatefulSet: a count read before the
        other's write never lands after it (a StatefulSet scaled back for a moment deletes a pod)."""
        with self._lock:
            return self._worker_count_locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """The consumer is gone: close its control and drop what was kept for it."""
        self.close(namespace, name)
        with self._lock:
            self._worker_count_locks.pop((namespace, name), None)

    def get(self, namespace: str, name: str) -> RangeControl | None:
        """The consumer's control, or None when the operator does not run that consumer."""
        with self._lock:
            return self._controls.get((namespace, name))

    def close(self, namespace: str, name: str) -> None:
        """Stop and forget one consumer's control (no-op when there is none)."""
        with self._lock:
            control = self._controls.pop((namespace, name), None)
            self._closed.add((namespace, name))
        if control is not None:
            control.close()

    def close_all(self) -> None:
        """Stop every control (operator shutdown, or the Lease lost), all at once: each close waits
        for its control's step in flight, and one after another those waits add up."""
        with self._lock:
            controls, self._controls = list(self._controls.values()), {}
        if len(controls) <= 1:
            for control in controls:
                control.close()
            return
        with ThreadPoolExecutor(len(controls), thread_name_prefix="keyrange-control-close") as pool:
            for closing in [pool.submit(control.close) for control in controls]:
                closing.result()

    def stop_all(self) -> None:
        """Stop every control for good: later `ensure` calls raise NotLeading (leadership lost or
        handed over; a handler still running must not start a control again)."""
        with self._lock:
            self._stopped = True
        self.close_all()


class NotLeading(RuntimeError):
    """The replica stopped leading; no range control may run here any more."""
