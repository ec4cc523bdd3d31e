"""Real Prometheus and Alertmanager (the Debian binaries) on 127.0.0.1, in a temp dir, fast.

Scrape and rule evaluation every second, `group_wait: 0s`, `group_interval: 1s`, so an alert with
`for: 1s` reaches the webhook a few seconds after its metric crosses. Targets are a file_sd file
that tests and benchmarks rewrite as workers come and go (Prometheus watches it with inotify).
Used by tests/integration/test_autoscale*.py and benchmarks/bench_scale_reaction.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from keyrange.local.monitoring import alertmanager_config, prometheus_config
from keyrange.local.ports import free_port


def _binary(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise RuntimeError(f"{name} not found: run `make tools` (scripts/install-tools.sh installs it)")
    return path


class PrometheusStack:
    """Prometheus scraping `set_targets`' endpoints with `rules`, alerting to an Alertmanager that
    posts every notification to `webhook_url` with a bearer token."""

    def __init__(self, workdir: Path, rules: Mapping[str, Any], webhook_url: str, token: str,
                 repeat_interval: str = "1m", targets_file: Path | None = None) -> None:
        self.dir = workdir
        self.targets_file = targets_file or workdir / "targets.json"
        """The file_sd file (`keyrange run --webhook-port` writes its own: pass that one)."""
        self.prometheus_port, self.alertmanager_port = free_port(), free_port()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._rules, self._webhook_url, self._token = rules, webhook_url, token
        self._repeat_interval = repeat_interval

    @property
    def prometheus_url(self) -> str:
        """Prometheus's HTTP API base URL."""
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        """Alertmanager's HTTP API base URL."""
        return f"http://127.0.0.1:{self.alertmanager_port}"

    def set_targets(self, targets: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        """Scrape exactly these `host:port` endpoints, each with its target labels."""
        groups = [{"targets": [addr], "labels": dict(labels)} for addr, labels in targets]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets_file)  # atomic: Prometheus never reads half a file

    def start(self) -> PrometheusStack:
        """Write the configs, start both servers and wait until they are ready."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rules.yml").write_text(yaml.safe_dump(dict(self._rules), sort_keys=False))
        if not self.targets_file.exists():
            self.set_targets([])
        config = prometheus_config(self.dir / "rules.yml", self.targets_file, f"127.0.0.1:{self.alertmanager_port}")
        config["global"]["scrape_timeout"] = "900ms"
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        (self.dir / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(
            self._webhook_url, self._token, repeat_interval=self._repeat_interval)))
        self._spawn("alertmanager", [
            _binary("prometheus-alertmanager"), f"--config.file={self.dir / 'alertmanager.yml'}",
            f"--storage.path={self.dir / 'am-data'}", f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
            "--cluster.listen-address=", "--log.level=warn",
        ])
        self._spawn("prometheus", [
            _binary("prometheus"), f"--config.file={self.dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.dir / 'prom-data'}", f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
            "--log.level=warn",
        ])
        for url in (self.alertmanager_url, self.prometheus_url):
            self._wait_ready(url)
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.dir / f"{name}.log").open("wb")
        self._procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir))

    def _wait_ready(self, base: str, timeout_seconds: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}); see {self.dir}/*.log")
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{base} not ready after {timeout_seconds} s; see {self.dir}/*.log")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as resp:
            return list(json.load(resp)["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Prometheus's active alerts (pending and firing)."""
        with urllib.request.urlopen(f"{self.prometheus_url}/api/v1/alerts", timeout=5) as resp:
            return list(json.load(resp)["data"]["alerts"])

    def stop(self) -> None:
        """Terminate both servers."""
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def __enter__(self) -> PrometheusStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

