"""The operator's registry of range controls, and the static fallback control."""

from __future__ import annotations

import threading

from keyrange.operator.rangecontrol import RangeControl
from keyrange.operator.registry import ControlRegistry
from keyrange.spec import StreamConsumerSpec, parse_spec
from tests.static_range_control import StaticRangeControl

SPEC = parse_spec({"kafka": {"topic": "t", "bootstrapServers": "k:9092", "partitions": 6},
                   "workers": {"min": 2, "max": 4}})


class Recording(StaticRangeControl):
    """A static control that remembers whether it was closed."""

    closed = False

    def close(self) -> None:
        self.closed = True


def _registry() -> tuple[ControlRegistry, list[Recording]]:
    made: list[Recording] = []

    def factory(namespace: str, name: str, spec: StreamConsumerSpec) -> RangeControl:
        made.append(Recording(spec))
        return made[-1]

    return ControlRegistry(factory), made


def test_one_control_per_consumer_and_spec_updates_reach_it() -> None:
    registry, made = _registry()
    first = registry.ensure("ns", "a", SPEC)
    bigger = SPEC.model_copy(update={"workers": SPEC.workers.model_copy(update={"replicas": 3})})
    assert registry.ensure("ns", "a", bigger) is first
    assert first is not None and first.desired_workers() == 3
    assert registry.ensure("other", "a", SPEC) is not first
    assert len(made) == 2


def test_a_refresh_after_delete_does_not_resurrect_the_control() -> None:
    registry, made = _registry()
    registry.ensure("ns", "a", SPEC)
    registry.close("ns", "a")
    assert made[0].closed
    assert registry.ensure("ns", "a", SPEC, revive=False) is None
    assert registry.get("ns", "a") is None
    again = registry.ensure("ns", "a", SPEC)  # re-created with the same name
    assert again is not None and len(made) == 2
    assert registry.ensure("ns", "a", SPEC, revive=False) is again


def test_close_all_stops_everything() -> None:
    registry, made = _registry()
    registry.ensure("ns", "a", SPEC)
    registry.ensure("ns", "b", SPEC)
    registry.close_all()
    assert all(c.closed for c in made) and registry.get("ns", "a") is None


def test_static_control_follows_replicas_and_refuses_to_rescale() -> None:
    control = StaticRangeControl(SPEC)
    assert control.desired_workers() == 2
    status = control.status()
    assert status.epoch == 1 and status.ranges == ((0, "0-2"), (1, "3-5"))
    outcome = control.request_scale("up", "test")
    assert not outcome.applied and "spec.workers.replicas" in outcome.detail


class Barriered(StaticRangeControl):
    """A control whose close returns only once every control of the registry is closing."""

    def __init__(self, spec: StreamConsumerSpec, barrier: threading.Barrier) -> None:
        super().__init__(spec)
        self._barrier = barrier
        self.closed = False

    def close(self) -> None:
        self._barrier.wait()  # BrokenBarrierError after its timeout if the closes ran one by one
        self.closed = True


def test_losing_the_lease_stops_every_control_at_once_not_one_after_another() -> None:
    """A leader that lost its Lease must stop every control before a standby's lease wait ends: a
    control's close takes as long as its step in flight, so closes one by one add up (a cut-off
    leader stopped its four controls 7 s after losing the Lease, 5 s after the standby took it)."""
    barrier = threading.Barrier(4, timeout=5)
    made: list[Barriered] = []

    def factory(namespace: str, name: str, spec: StreamConsumerSpec) -> RangeControl:
        made.append(Barriered(spec, barrier))
        return made[-1]

    registry = ControlRegistry(factory)
    for name in "abcd":
        registry.ensure("ns", name, SPEC)
    registry.stop_all()
    assert all(c.closed for c in made)
