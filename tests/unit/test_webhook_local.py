"""The alert path of `keyrange run`: config files Prometheus/Alertmanager accept, file_sd targets,
the receiver reaching the supervisor, and the planner's own lag triggers switched off."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyrange.local.monitoring import AlertingOptions, LocalAlertPath, without_lag_thresholds
from keyrange.ranges.planner import Direction, Planner, ScaleOutcome, ScalingLimits, SlotLag
from keyrange.ranges.rangemap import RangeMap
from keyrange.spec import parse_document
from tests.alertmanager import alert, payload

CONSUMER = parse_document({
    "apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer", "metadata": {"name": "payments"},
    "spec": {"kafka": {"topic": "payments"}, "scaling": {"cooldownSeconds": 30}},
})


class Target:
    def __init__(self) -> None:
        self.calls: list[Direction] = []

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        self.calls.append(direction)
        return ScaleOutcome(True, "ok", 1, 2)


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: run `make tools`"
    return path


@pytest.fixture
def path(tmp_path: Path) -> Iterator[LocalAlertPath]:
    p = LocalAlertPath(AlertingOptions(0, "tok"), CONSUMER, tmp_path)
    yield p
    p.stop()


def test_written_configs_pass_promtool_and_amtool(path: LocalAlertPath) -> None:
    path.start(Target())
    for argv in ([_tool("promtool"), "check", "config", str(path.dir / "prometheus.yml")],
                 [_tool("amtool"), "check-config", str(path.dir / "alertmanager.yml")]):
        out = subprocess.run(argv, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    am = yaml.safe_load((path.dir / "alertmanager.yml").read_text())
    assert am["receivers"][0]["webhook_configs"][0]["url"] == path.webhook_url
    rules = yaml.safe_load(path.rules_file.read_text())["groups"][0]["rules"]
    assert all(r["labels"]["namespace"] == "default" and "namespace=" not in r["expr"] for r in rules)


TOKEN = "s3cret-only-in-alertmanager-yml"
_watch: dict[str, Any] = {"dir": None, "busy": False, "seen": []}


def _loose_token_files(event: str, args: Any) -> None:
    """Audit hook: at every audited operation while a directory is watched, note each file in it
    that holds the token and that group or others may read (the file's mode, right then)."""
    directory = _watch["dir"]
    if directory is None or _watch["busy"]:
        return
    _watch["busy"] = True  # the checks below are audited operations themselves
    try:
        for entry in os.scandir(directory) if os.path.isdir(directory) else ():
            mode = entry.stat().st_mode
            if stat.S_ISREG(mode) and mode & 0o077 and TOKEN in Path(entry.path).read_text(errors="replace"):
                _watch["seen"].append((event, entry.name, oct(mode & 0o777)))
    finally:
        _watch["busy"] = False


sys.addaudithook(_loose_token_files)


def test_the_token_is_never_in_a_file_others_may_read(tmp_path: Path) -> None:
    # Every file operation is audited: a file written first and chmodded after is seen at the chmod.
    alerts = LocalAlertPath(AlertingOptions(0, TOKEN), CONSUMER, tmp_path)
    umask = os.umask(0o022)
    _watch.update(dir=str(alerts.dir), seen=[])
    try:
        alerts.start(Target())
    finally:
        _watch["dir"] = None
        os.umask(umask)
        alerts.stop()
    assert _watch["seen"] == []
    config = alerts.dir / "alertmanager.yml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and TOKEN in config.read_text()
    assert sorted(p.name for p in alerts.dir.iterdir()) == ["alertmanager.yml", "prometheus.yml", "rules.yml",
                                                             "targets.json"]


def test_targets_follow_the_workers(path: LocalAlertPath) -> None:
    path.start(Target())
    assert json.loads(path.targets_file.read_text()) == []
    path.update_targets({1: "http://127.0.0.1:9101/metrics", 0: "http://127.0.0.1:9100/metrics"})
    groups = json.loads(path.targets_file.read_text())
    assert groups == [
        {"targets": ["127.0.0.1:9100"], "labels": {"consumer": "payments", "worker": "0"}},
        {"targets": ["127.0.0.1:9101"], "labels": {"consumer": "payments", "worker": "1"}},
    ]
    before = path.targets_file.stat().st_mtime_ns
    path.update_targets({0: "http://127.0.0.1:9100/metrics", 1: "http://127.0.0.1:9101/metrics"})
    assert path.targets_file.stat().st_mtime_ns == before  # unchanged set: not rewritten


def test_the_receiver_reaches_the_supervisor(path: LocalAlertPath) -> None:
    target = Target()
    url = path.start(target)
    body = json.dumps(payload(alert(namespace="default"))).encode()
    req = urllib.request.Request(url, data=body, headers={"Authorization": "Bearer tok"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    assert target.calls == ["up"]
    assert [(d.direction, d.applied) for d in path.decisions] == [("up", True)]


def test_alerts_decide_while_limits_and_cooldown_still_hold() -> None:
    limits = without_lag_thresholds(ScalingLimits(min_workers=1, max_workers=2, cooldown_seconds=30))
    planner = Planner(limits)
    one = RangeMap.even(12, 1)
    flooded = {s: SlotLag(10**9, 10**6) for s in range(12)}
    assert planner.decide(one, flooded, now=100.0).next_map is None      # lag alone does not split
    split = planner.decide(one, flooded, now=100.0, force="up")
    assert split.next_map is not None and split.next_map.workers == 2
    two = split.next_map
    assert planner.decide(two, {}, now=101.0, force="down").next_map is None   # cooldown holds
    assert planner.decide(two, {}, now=200.0).next_map is None                 # idle alone does not merge
    assert planner.decide(two, flooded, now=200.0, force="up").next_map is None  # workers.max holds
