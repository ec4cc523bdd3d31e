"""The chart's Grafana dashboard: installed as a ConfigMap labelled for Grafana's sidecar when monitoring
is on, every PromQL expression accepted by promtool, every metric it reads exported by keyrange, and
the subjects an operator looks for all there (throughput, lag, latency, handoffs, pauses, dead letters)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import keyrange.metrics  # noqa: F401 - registers every keyrange_* metric
from tests.helmtools import by_kind, helm_template

DASHBOARD = Path(__file__).parents[2] / "charts" / "keyrange" / "files" / "grafana" / "keyrange-dashboard.json"
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$namespace": ".*", "$consumer": ".*"}
PROMETHEUS_SERIES = {"up"}
"""Series Prometheus makes itself for every target."""


def _dashboards(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"].get("labels", {})]


@pytest.mark.parametrize(("sets", "installed"), [
    ((), False),
    (("monitoring.serviceMonitor=true",), True),
    (("monitoring.serviceMonitor=true", "monitoring.grafanaDashboard.enabled=false"), False),
    (("monitoring.grafanaDashboard.enabled=true",), True),
])
def test_the_dashboard_follows_monitoring(tmp_path: Path, sets: tuple[str, ...], installed: bool) -> None:
    found = _dashboards(helm_template(tmp_path, *sets))
    assert bool(found) == installed
    if found:
        (cm,) = found
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(cm["data"]["keyrange.json"]) == json.loads(DASHBOARD.read_text())


def test_the_dashboard_can_go_to_grafanas_namespace(tmp_path: Path) -> None:
    (cm,) = _dashboards(helm_template(tmp_path, "monitoring.grafanaDashboard.enabled=true",
                                      "monitoring.grafanaDashboard.namespace=grafana",
                                      "monitoring.grafanaDashboard.annotations.grafana_folder=Streaming"))
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Streaming"}


def _expressions() -> dict[str, str]:
    """Every PromQL expression of the dashboard, with Grafana's variables filled in, by where it is."""
    dash = json.loads(DASHBOARD.read_text())
    found = {}
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            found[f"{panel['title']} / {target['refId']}"] = target["expr"]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            # label_values(SELECTOR, label) is Grafana's; its selector is PromQL.
            selector = re.fullmatch(r"label_values\((.*), *\w+\)", var["query"]["query"])
            assert selector, var["query"]
            found[f"variable {var['name']}"] = selector.group(1)
    out = {}
    for where, expr in found.items():
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"{where}: a Grafana variable the test does not know: {expr}"
        out[where] = expr
    return out


def test_promtool_accepts_every_expression(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: run `make tools` (scripts/install-tools.sh installs prometheus)"
    exprs = _expressions()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expression_{i}", "expr": expr} for i, expr in enumerate(exprs.values())]}]}
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboard.yml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(exprs)} rules found" in out.stdout


def _exported() -> set[str]:
    """The sample names keyrange's metrics expose (a counter's `_total`, a histogram's `_bucket`, ...)."""
    names = set()
    for family in REGISTRY.collect():
        if not family.name.startswith("keyrange_"):
            continue
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
        names |= {family.name + s for s in suffixes}
    return names


def test_every_metric_the_dashboard_reads_is_exported() -> None:
    exported = _exported()
    assert "keyrange_handoff_pause_seconds_bucket" in exported and "keyrange_events_processed_total" in exported
    for where, expr in _expressions().items():
        read = set(re.findall(r"\b(keyrange_\w+|up)\b(?=\s*[{\[)]|\s*$)", expr))
        assert read, f"{where} reads no metric: {expr}"
        unknown = read - exported - PROMETHEUS_SERIES
        assert not unknown, f"{where} reads metrics keyrange does not export: {sorted(unknown)}"


def test_the_operators_series_are_queried_by_streamconsumer_namespace() -> None:
    for where, expr in _expressions().items():
        if "keyrange_operator_" in expr or "keyrange_scale_requests" in expr:
            assert "streamconsumer_namespace" in expr and not re.search(r"\bnamespace\b", expr), where


@pytest.mark.parametrize(("subject", "metric"), [
    ("throughput", "keyrange_events_processed_total"),
    ("lag in records", "keyrange_consumer_lag"),
    ("lag in seconds", "keyrange_consumer_lag_seconds"),
    ("latency", "keyrange_event_latency_seconds_bucket"),
    ("handoffs", "keyrange_handoff_pause_seconds_count"),
    ("handoff pauses", "keyrange_handoff_pause_seconds_bucket"),
    ("backpressure pauses", "keyrange_partition_paused"),
    ("dead letters", "keyrange_dead_letters_total"),
])
def test_the_dashboard_covers(subject: str, metric: str) -> None:
    assert any(re.search(rf"\b{metric}\b", expr) for expr in _expressions().values()), subject
