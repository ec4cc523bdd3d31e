"""How the suite runs in parallel (pytest-xdist, `make pytest`: `-n N --dist loadgroup`).

Every xdist worker is its own pytest session: its own session fixtures (the embedded broker, a
Kafka node), on free ports (keyrange/local/ports.py), in temporary directories of its own, with
topic names that carry its process id (tests/conftest.py `topic_name`). What is too heavy to start
once per worker is started by one worker only: every test that uses it is put in one xdist group,
which `--dist loadgroup` runs on a single worker. Without xdist the groups change nothing.

xdist tells its scheduler a test's group by appending "@group" to the test's id on the worker. With
pytest 9.2 its way of doing so no longer takes (pytest-dev/pytest-xdist#1386: the tests are spread
as if ungrouped), so `pytest_collection_modifyitems` below appends it where xdist's did not.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

HEAVY_FIXTURES = {
    "control_plane": "kube",
    "_kafka_cluster3_session": "kafka3",
    "spark": "spark",
}
"""Session fixture -> the xdist group of every test that uses it: the kube control plane (etcd,
kube-apiserver, kube-controller-manager), the 3-node Kafka cluster, and the local Spark session."""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, Any, Any]:
    """Put each test that uses a HEAVY_FIXTURES fixture in that fixture's group, before xdist's own
    hook reads the marks; after it, make sure each grouped test's id says its group."""
    for item in items:
        used = [group for fixture, group in HEAVY_FIXTURES.items() if fixture in item.fixturenames]  # type: ignore[attr-defined]
        if used and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(used[0]))
    result = yield
    if config.getoption("loadgroup", False):  # set on xdist's workers by --dist loadgroup
        for item in items:
            _name_the_group(item)
    return result


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
