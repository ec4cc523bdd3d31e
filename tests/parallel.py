"""How the suite runs in parallel (pytest-xdist, `make pytest`: `-n N --dist loadgroup`).

Every xdist worker is its own pytest session: its own session fixtures (the embedded broker, a
Kafka node), on free ports (keyrange/local/ports.py), in temporary directories of its own, with
topic names that carry its process id (tests/conftest.py `topic_name`). What is too heavy to start
once per worker is started by one worker only: every test that uses it is put in one xdist group,
which `--dist loadgroup` runs on a single worker. Without xdist the groups change nothing.

Such a fixture is stopped as soon as the last test of its process that uses it has run
(`stopped_after_its_last_test`), not at the session's end: its worker goes on with other tests for
most of the run, and they do not share the machine with an idle cluster.

xdist tells its scheduler a test's group by appending "@group" to the test's id on the worker. With
pytest 9.2 its way of doing so no longer takes (pytest-dev/pytest-xdist#1386: the tests are spread
as if ungrouped), so `pytest_collection_modifyitems` below appends it where xdist's did not.

The modules that hold a `slow` test run first (`slow_modules_first`): `--dist loadgroup` hands the
ungrouped tests out in collection order, so a slow test collected late (the operator tier's
end-to-end tests come after the whole integration tier) would run alone at the end while the other
workers have nothing left. Each module's tests stay together and in order, so a module fixture is
set up once per worker that runs them, as before.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

HEAVY_FIXTURES = {
    "control_plane": "kube",
    "_kafka_cluster3_session": "kafka3",
    "spark": "spark",
}
"""Session fixture -> the xdist group of every test that uses it: the kube control plane (etcd,
kube-apiserver, kube-controller-manager), the 3-node Kafka cluster, and the local Spark session."""


_USES_LEFT: Counter[str] = Counter()
"""Heavy fixture -> the tests of this process's collection that use it and have not run yet."""
_DONE: set[str] = set()
"""The tests whose use of a heavy fixture was counted off (a test run twice counts once)."""
_STOPS: dict[str, Callable[[], None]] = {}
"""Heavy fixture -> how to stop it early, while it runs (`stopped_after_its_last_test`)."""


@contextlib.contextmanager
def stopped_after_its_last_test(request: pytest.FixtureRequest, stop: Callable[[], None]) -> Iterator[None]:
    """Around a HEAVY_FIXTURES fixture's yield: `stop` runs once the last test of this process
    that uses the fixture has run and its module's fixtures are torn down (module docstring); at
    the latest when the fixture is finalized. It runs once either way."""
    stopped = False

    def once() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            stop()

    _STOPS[request.fixturename] = once
    try:
        yield
    finally:
        _STOPS.pop(request.fixturename, None)
        once()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Count, per heavy fixture, the tests that use it (an xdist worker runs all of them or none)."""
    _USES_LEFT.clear()
    _DONE.clear()
    for item in session.items:
        _USES_LEFT.update(f for f in HEAVY_FIXTURES if f in getattr(item, "fixturenames", ()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    """After a test's teardown, stop each heavy fixture no test left in this process uses, once
    no module fixture that may hold it is up (the next test is in another module, or none)."""
    try:
        return (yield)
    finally:
        if item.nodeid not in _DONE:
            _DONE.add(item.nodeid)
            _USES_LEFT.subtract(f for f in HEAVY_FIXTURES if f in getattr(item, "fixturenames", ()))
        if nextitem is None or nextitem.getparent(pytest.Module) is not item.getparent(pytest.Module):
            # A fixture no collected test names (one taken by getfixturevalue) waits for the session's end.
            for fixture in [f for f in _STOPS if f in _USES_LEFT and _USES_LEFT[f] <= 0]:
                _STOPS.pop(fixture)()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, Any, Any]:
    """Put each test that uses a HEAVY_FIXTURES fixture in that fixture's group, before xdist's own
    hook reads the marks; after it, make sure each grouped test's id says its group."""
    items[:] = slow_modules_first(items)
    for item in items:
        used = [group for fixture, group in HEAVY_FIXTURES.items() if fixture in item.fixturenames]  # type: ignore[attr-defined]
        if used and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(used[0]))
    result = yield
    if config.getoption("loadgroup", False):  # set on xdist's workers by --dist loadgroup
        for item in items:
            _name_the_group(item)
    return result


def slow_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with the modules that hold a test marked `slow` first, otherwise in the same order
    (module docstring): the same on every xdist worker, as xdist requires."""
    slow = {item.getparent(pytest.Module) for item in items if item.get_closest_marker("slow") is not None}
    return sorted(items, key=lambda item: item.getparent(pytest.Module) not in slow)


def _name_the_group(item: pytest.Item) -> None:
    """Append "@group" to a grouped test's id unless xdist did (module docstring)."""
    marks = list(item.iter_markers("xdist_group"))
    if not marks:
        return
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})
    grouped = f"{item.nodeid}@{'_'.join(names)}"
    if "@" in item.nodeid.rsplit("]", 1)[-1] or not hasattr(item, "_id"):
        return  # xdist's own suffix took (pytest before 9.2 keeps the id in `_nodeid`)
    from _pytest.nodeid import NodeId  # pytest 9.2's structured ids

    item._id = NodeId.parse(grouped)  # type: ignore[attr-defined]
