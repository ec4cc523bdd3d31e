"""The alerting rules rendered per StreamConsumer: shape, thresholds, and promtool's verdict.

`promtool test rules` runs the alert unit tests in tests/integration/prometheus/ against the
rules rendered for a sample consumer, so every alert's expression, `for` and labels are checked
by the real Prometheus rule engine (offline, ~0.1 s).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyrange import __version__
from keyrange.autoscale import rules
from keyrange.spec import parse_spec

PROMTOOL_TESTS = Path(__file__).parents[1] / "integration" / "prometheus" / "keyrange_rules_test.yml"

SAMPLE = {
    "kafka": {"topic": "events"},
    "workers": {"min": 1, "max": 6},
    "scaling": {"lagHighRecords": 5000, "lagHighSeconds": 5, "lagLowRecords": 100, "cooldownSeconds": 60},
}


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: run `make tools` (scripts/install-tools.sh installs prometheus)"
    return path


def _write_rules(tmp_path: Path, spec: dict[str, Any]) -> Path:
    rendered = rules.render_rule_groups("payments", "shop", parse_spec(spec))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rendered, sort_keys=False))
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    return tmp_path / "rules.yml"


def test_promtool_accepts_the_rendered_rules(tmp_path: Path) -> None:
    rules_file = _write_rules(tmp_path, SAMPLE)
    out = subprocess.run([_promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 rules found" in out.stdout


def test_every_alert_passes_its_promtool_unit_test(tmp_path: Path) -> None:
    _write_rules(tmp_path, SAMPLE)
    out = subprocess.run([_promtool(), "test", "rules", PROMTOOL_TESTS.name], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    tested = {t["alertname"] for case in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    rendered = {r["alert"] for r in yaml.safe_load((tmp_path / "rules.yml").read_text())["groups"][0]["rules"]}
    assert rendered <= tested, f"alerts without a promtool test: {rendered - tested}"


@pytest.mark.parametrize("scaling", [
    {"lagHighRecords": 7000},          # the 6000-record range no longer fires
    {"lagHighSeconds": 20},            # a 15 s old event no longer fires
    {"cooldownSeconds": 120},          # the merge fires later than the test expects
])
def test_promtool_tests_follow_the_spec_thresholds(tmp_path: Path, scaling: dict[str, Any]) -> None:
    spec = {**SAMPLE, "scaling": {**SAMPLE["scaling"], **scaling}}
    _write_rules(tmp_path, spec)
    out = subprocess.run([_promtool(), "test", "rules", PROMTOOL_TESTS.name], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode != 0, "promtool tests still pass with other thresholds: they test nothing"


def test_every_alert_names_its_consumer_and_is_documented() -> None:
    groups = rules.render_rule_groups("payments", "shop", parse_spec(SAMPLE))["groups"]
    assert len(groups) == 1
    alerts = {r["alert"]: r for r in groups[0]["rules"]}
    assert set(alerts) == {rules.ALERT_LAG_HIGH_RECORDS, rules.ALERT_LAG_HIGH_SECONDS, rules.ALERT_LAG_LOW,
                           rules.ALERT_WORKER_DOWN, rules.ALERT_DEAD_LETTERS}
    for rule in alerts.values():
        assert rule["labels"][rules.CONSUMER_LABEL] == "payments"
        assert rule["labels"][rules.NAMESPACE_LABEL] == "shop"
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
    scale = {name: r["labels"].get(rules.SCALE_LABEL) for name, r in alerts.items()}
    assert scale == {rules.ALERT_LAG_HIGH_RECORDS: "up", rules.ALERT_LAG_HIGH_SECONDS: "up",
                     rules.ALERT_LAG_LOW: "down", rules.ALERT_WORKER_DOWN: None, rules.ALERT_DEAD_LETTERS: None}
    assert alerts[rules.ALERT_LAG_LOW]["for"] == "60s"
    assert "> 5000" in alerts[rules.ALERT_LAG_HIGH_RECORDS]["expr"]


def test_local_rules_do_not_match_on_namespace() -> None:
    opts = rules.RuleOptions(match_namespace=False, evaluation_interval_seconds=1, lag_high_for_seconds=2.5)
    group = rules.render_rule_groups("payments", "local", parse_spec(SAMPLE), opts)["groups"][0]
    assert group["interval"] == "1s"
    for rule in group["rules"]:
        assert "namespace=" not in rule["expr"]
        assert rule["labels"][rules.NAMESPACE_LABEL] == "local"
    assert group["rules"][0]["for"] == "2500ms"


def test_prometheus_rule_object() -> None:
    obj = rules.render_prometheus_rule("payments", "shop", parse_spec(SAMPLE), labels={"release": "prom"})
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["namespace"] == "shop"
    assert obj["metadata"]["labels"]["release"] == "prom"
    assert obj["spec"]["groups"][0]["rules"][0]["alert"] == rules.ALERT_LAG_HIGH_RECORDS


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (5, "5s"), (2.5, "2500ms"), (300, "300s")])
def test_duration(seconds: float, text: str) -> None:
    assert rules.duration(seconds) == text


def test_negative_durations_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        rules.duration(-1)
    with pytest.raises(ValueError, match="lag_high_for_seconds"):
        rules.RuleOptions(lag_high_for_seconds=-1)


def test_runbook_urls_are_absolute_and_point_at_a_heading_of_the_autoscaling_docs() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "autoscaling.md").read_text()
    anchors = {line.lstrip("#").strip().lower().replace(" ", "-") for line in docs.splitlines()
               if line.startswith("#")}
    for rule in rules.render_rule_groups("payments", "shop", parse_spec(SAMPLE))["groups"][0]["rules"]:
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == f"https://github.com/keyrange/keyrange/blob/v{__version__}/docs/autoscaling.md", url
        assert anchor in anchors, f"{rule['alert']}: docs/autoscaling.md has no heading for #{anchor}"
    with pytest.raises(ValueError, match="absolute"):
        rules.RuleOptions(runbook_url="docs/autoscaling.md")


def test_a_suspended_consumer_has_no_worker_down_alert() -> None:
    suspended = parse_spec({**SAMPLE, "suspend": True})
    alerts = [r["alert"] for r in rules.render_rule_groups("payments", "shop", suspended)["groups"][0]["rules"]]
    assert rules.ALERT_WORKER_DOWN not in alerts and rules.ALERT_DEAD_LETTERS in alerts
