"""The chart's static PrometheusRule and AlertmanagerConfig: rendered with `helm template`, the rules
checked and unit-tested by promtool, the receiver route pointing at the operator's webhook."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helmtools import CHART, HELM_FALLBACK, ROOT, by_kind, helm_template, tool_path

PROMTOOL_TESTS = ROOT / "tests" / "integration" / "prometheus" / "chart_rules_test.yml"


def test_nothing_alerting_is_installed_by_default(tmp_path: Path) -> None:
    docs = helm_template(tmp_path)
    assert by_kind(docs, "PrometheusRule") == [] and by_kind(docs, "AlertmanagerConfig") == []


def test_static_rules_pass_promtool(tmp_path: Path) -> None:
    (rule,) = by_kind(helm_template(tmp_path, "autoscaling.prometheusRule.enabled=true"), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "streams"
    (tmp_path / "chart_rules.yml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    promtool = tool_path("promtool")
    check = subprocess.run([promtool, "check", "rules", "chart_rules.yml"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", PROMTOOL_TESTS.name], cwd=tmp_path, capture_output=True,
                          text=True)
    assert test.returncode == 0, test.stdout + test.stderr
    alerts = {r["alert"] for r in rule["spec"]["groups"][0]["rules"]}
    tested = {t["alertname"] for case in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert alerts == tested


def test_thresholds_come_from_values(tmp_path: Path) -> None:
    docs = helm_template(tmp_path, "autoscaling.prometheusRule.enabled=true",
                         "autoscaling.prometheusRule.lagHighRecords=123", "autoscaling.prometheusRule.lagLowFor=5m")
    rules = {r["alert"]: r for r in by_kind(docs, "PrometheusRule")[0]["spec"]["groups"][0]["rules"]}
    assert rules["KeyrangeLagHighRecords"]["expr"].endswith("> 123")
    assert rules["KeyrangeLagLow"]["for"] == "5m"


def test_scaling_alerts_can_be_left_to_the_operator(tmp_path: Path) -> None:
    docs = helm_template(tmp_path, "autoscaling.prometheusRule.enabled=true",
                         "autoscaling.prometheusRule.scaling=false")
    rules = by_kind(docs, "PrometheusRule")[0]["spec"]["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {"KeyrangeWorkerDown", "KeyrangeDeadLettersRising"}
    assert not any("keyrange_scale" in r["labels"] for r in rules)


def test_alertmanager_config_routes_scaling_alerts_to_the_operator(tmp_path: Path) -> None:
    docs = helm_template(tmp_path, "autoscaling.alertmanagerConfig.enabled=true",
                         "autoscaling.alertmanagerConfig.labels.alertmanagerConfig=main")
    (config,) = by_kind(docs, "AlertmanagerConfig")
    assert config["metadata"]["labels"]["alertmanagerConfig"] == "main"
    route = config["spec"]["route"]
    assert route["matchers"] == [{"name": "keyrange_scale", "matchType": "=~", "value": "up|down"}]
    (hook,) = config["spec"]["receivers"][0]["webhookConfigs"]
    service = next(s for s in by_kind(docs, "Service") if any(p["name"] == "webhook" for p in s["spec"]["ports"]))
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "webhook")
    assert hook["url"] == f"http://{service['metadata']['name']}.streams.svc:{port}/alertmanager/webhook"
    assert hook["sendResolved"] is True
    secret = hook["httpConfig"]["authorization"]["credentials"]
    assert secret["key"] == "token"
    assert secret["name"] in {s["metadata"]["name"] for s in by_kind(docs, "Secret")}


def test_no_alertmanager_config_without_the_webhook(tmp_path: Path) -> None:
    docs = helm_template(tmp_path, "autoscaling.alertmanagerConfig.enabled=true", "webhook.enabled=false")
    assert by_kind(docs, "AlertmanagerConfig") == []


@pytest.mark.parametrize("bad", ["autoscaling.prometheusRule.lagHighFor=soon",
                                 "autoscaling.prometheusRule.lagHighRecords=0"])
def test_bad_values_are_refused_by_the_schema(tmp_path: Path, bad: str) -> None:
    env = {**os.environ, **{k: str(tmp_path / k) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}}
    out = subprocess.run([tool_path("helm", HELM_FALLBACK), "template", "kr", str(CHART),
                          "--set", bad], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "autoscaling" in out.stderr
