"""keyrange's metrics never use a label that Prometheus' scrape sets itself on every target.

A scraped series whose own label collides with a target label is renamed `exported_<label>`
(honor_labels: false, the default and the Prometheus Operator's), so a query on the name in
docs/design.md or the dashboard would find nothing: the operator's series name a
StreamConsumer's namespace `streamconsumer_namespace`.
"""

from __future__ import annotations

from typing import Any

from keyrange import metrics

TARGET_LABELS = {"namespace", "pod", "service", "container", "endpoint", "job", "instance"}
"""Target labels of a Prometheus Operator ServiceMonitor scrape, plus Prometheus' own."""


def _declared() -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for value in vars(metrics).values():
        names: Any = getattr(value, "_labelnames", None) or getattr(value, "labelnames", None)
        name = getattr(value, "_name", None) or getattr(value, "name", None)
        if isinstance(name, str) and name.startswith("keyrange_") and names is not None:
            found[name] = tuple(names)
    return found


def test_every_metric_is_found() -> None:
    declared = _declared()
    assert {"keyrange_operator_desired_workers", "keyrange_scale_requests", "keyrange_events_processed",
            "keyrange_handoff_pause_seconds"} <= set(declared)


def test_no_metric_uses_a_label_the_scrape_sets() -> None:
    clashes = {name: sorted(set(labels) & TARGET_LABELS) for name, labels in _declared().items()
               if set(labels) & TARGET_LABELS}
    assert clashes == {}, f"Prometheus would rename these to exported_*: {clashes}"


def test_the_operator_names_a_consumer_by_namespace_and_name() -> None:
    declared = _declared()
    for name in ("keyrange_operator_desired_workers", "keyrange_scale_requests"):
        assert {"streamconsumer_namespace", "consumer"} <= set(declared[name])
