"""The alert path of `keyrange run --webhook-port P`: scaling driven by Prometheus and Alertmanager.

Without `--webhook-port` the supervisor's planner reads lag from the workers and decides itself.
With it, the decisions come from alerts, exactly as in a cluster: the supervisor serves the same
webhook receiver as the operator, turns off the planner's own lag thresholds (limits and cooldown
stay), and writes into `<run-dir>/prometheus/` everything a local Prometheus and Alertmanager need:

    rules.yml          the consumer's alerts (keyrange.autoscale.rules), namespace label "default"
    targets.json       file_sd targets: every worker's /metrics, rewritten as workers come and go
    prometheus.yml     scrape + rules + alerting to Alertmanager on 127.0.0.1:9093
    alertmanager.yml   one webhook receiver pointing at this process, with the bearer token (mode 0600)

    prometheus --config.file <run-dir>/prometheus/prometheus.yml
    prometheus-alertmanager --config.file <run-dir>/prometheus/alertmanager.yml --cluster.listen-address=
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from keyrange.autoscale.receiver import WEBHOOK_PATH, AlertReceiver, ScaleDecision, ScaleTarget
from keyrange.autoscale.rules import RuleOptions, render_rule_groups
from keyrange.autoscale.tracker import DEFAULT_NAMESPACE, ConsumerRef
from keyrange.errors import UserError
from keyrange.ranges.planner import ScalingLimits
from keyrange.spec import StreamConsumer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlertingOptions:
    """How `keyrange run` serves the alert path."""

    webhook_port: int
    """Port of the webhook receiver on 127.0.0.1 (0: any free port)."""
    token: str
    """Bearer token Alertmanager must send."""
    alertmanager_port: int = 9093
    """Where the written prometheus.yml expects Alertmanager."""
    lag_high_for_seconds: float = 2.0
    """`for:` of the lag-high alerts (the scale reaction time grows with it)."""


def without_lag_thresholds(limits: ScalingLimits) -> ScalingLimits:
    """The planner's limits with its own lag triggers off: alerts decide, forced requests still
    respect workers.min/max and the cooldown."""
    return dataclasses.replace(limits, lag_high_records=2**62, lag_high_seconds=math.inf, lag_low_records=0,
                               policy="step")


def prometheus_config(rules_file: Path, targets_file: Path, alertmanager: str,
                      interval: str = "1s") -> dict[str, Any]:
    """A Prometheus config scraping the file_sd targets, evaluating keyrange's rules, alerting."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules_file)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{
            "job_name": "keyrange-workers",
            "honor_labels": True,  # keep the workers' own consumer/worker labels
            "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
        }],
    }


def alertmanager_config(webhook_url: str, token: str, group_wait: str = "0s", group_interval: str = "1s",
                        repeat_interval: str = "1m") -> dict[str, Any]:
    """An Alertmanager config sending keyrange's alerts to the receiver (docs/autoscaling.md has the
    cluster version of the same route)."""
    return {
        "route": {
            "receiver": "keyrange",
            "group_by": ["namespace", "streamconsumer", "alertname"],
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
        },
        "receivers": [{
            "name": "keyrange",
            "webhook_configs": [{
                "url": webhook_url,
                "send_resolved": True,
                "http_config": {"authorization": {"type": "Bearer", "credentials": token}},
            }],
        }],
    }


def write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only (it holds a secret), with no moment at which the
    secret sits in a file others may read: a temporary file created 0600 is renamed over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class ReceiverServer:
    """The receiver served on host:port from a thread of its own (for synchronous callers such as
    `keyrange run`'s supervisor); targets are then called from that thread."""

    def __init__(self, receiver: AlertReceiver, host: str = "127.0.0.1", port: int = 0) -> None:
        self._receiver, self._host, self._port = receiver, host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="keyrange-alert-webhook", daemon=True)
        self.port = 0
        """The bound port (useful with port 0)."""

    @property
    def url(self) -> str:
        """The webhook URL to give Alertmanager."""
        return f"http://{self._host}:{self.port}{WEBHOOK_PATH}"

    def start(self) -> ReceiverServer:
        """Bind and serve; raises UserError if the port cannot be bound."""
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise UserError(f"cannot serve the alert webhook on {self._host}:{self._port}: {self._error}; "
                            "choose another --webhook-port") from None
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = web.AppRunner(self._receiver.app(), access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self._host, self._port)
            self._loop.run_until_complete(site.start())
            self.port = self._runner.addresses[0][1]
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def close(self) -> None:
        """Stop serving and join the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> ReceiverServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalAlertPath:
    """Serves the receiver for one local consumer and keeps the Prometheus files current."""

    def __init__(self, options: AlertingOptions, consumer: StreamConsumer, run_dir: Path) -> None:
        self.options = options
        self.consumer = consumer
        self.ref = ConsumerRef(consumer.metadata.namespace or DEFAULT_NAMESPACE, consumer.name)
        self.dir = run_dir / "prometheus"
        self.decisions: list[ScaleDecision] = []
        """Every scale request the alerts caused, with its outcome (newest last)."""
        self.receiver = AlertReceiver(options.token, on_decision=self.decisions.append)
        self._server: ReceiverServer | None = None
        self._targets: list[tuple[int, str]] | None = None

    @property
    def targets_file(self) -> Path:
        """The file_sd file Prometheus watches."""
        return self.dir / "targets.json"

    @property
    def rules_file(self) -> Path:
        """The rendered alert rules."""
        return self.dir / "rules.yml"

    def start(self, target: ScaleTarget) -> str:
        """Serve the receiver for `target` and write the config files; return the webhook URL."""
        self.receiver.register(self.ref, target, self.consumer.spec.scaling.cooldown_seconds)
        self._server = ReceiverServer(self.receiver, "127.0.0.1", self.options.webhook_port).start()
        self.dir.mkdir(parents=True, exist_ok=True)
        rules = render_rule_groups(self.ref.name, self.ref.namespace, self.consumer.spec, RuleOptions(
            lag_high_for_seconds=self.options.lag_high_for_seconds, match_namespace=False))
        self.rules_file.write_text(yaml.safe_dump(rules, sort_keys=False))
        self.update_targets({})
        am = f"127.0.0.1:{self.options.alertmanager_port}"
        (self.dir / "prometheus.yml").write_text(
            yaml.safe_dump(prometheus_config(self.rules_file, self.targets_file, am), sort_keys=False))
        write_private(self.dir / "alertmanager.yml",
                      yaml.safe_dump(alertmanager_config(self._server.url, self.options.token), sort_keys=False))
        log.info("alert webhook at %s; Prometheus files in %s", self._server.url, self.dir)
        return self._server.url

    def update_targets(self, metrics_urls: Mapping[int, str]) -> None:
        """Point Prometheus at the workers now running (ordinal -> /metrics URL); atomic, and only
        when the set changed."""
        current = sorted(metrics_urls.items())
        if current == self._targets:
            return
        groups = []
        for ordinal, url in current:
            address = url.removeprefix("http://").removesuffix("/metrics")
            groups.append({"targets": [address], "labels": {"consumer": self.ref.name, "worker": str(ordinal)}})
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        os.replace(tmp, self.targets_file)  # Prometheus must never read half a file
        self._targets = current

    @property
    def webhook_url(self) -> str:
        """The receiver's URL (after `start`)."""
        assert self._server is not None, "LocalAlertPath.start() was not called"
        return self._server.url

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.close()

