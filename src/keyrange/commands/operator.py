"""`keyrange operator`: the kopf operator that reconciles StreamConsumers in a cluster.

Runs kopf's operator loop with keyrange's handlers (keyrange.operator.handlers), a liveness
endpoint and a Prometheus metrics endpoint. Peering (kopf's ClusterKopfPeering / KopfPeering
objects, installed by the chart) makes exactly one of several replicas act.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
from collections.abc import Coroutine
from typing import Any

from keyrange.errors import UserError
from keyrange.operator.settings import OperatorSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange operator`."""
    parser.add_argument("-n", "--namespace", action="append", default=[],
                        help="watch this namespace (repeatable; default: all namespaces)")
    parser.add_argument("--peering", default="keyrange",
                        help="kopf peering object name, so only one operator replica acts (default keyrange)")
    parser.add_argument("--priority", type=int, default=random.randint(1, 1_000_000),
                        help="peering priority: the highest-priority operator acts, the others wait "
                             "(default: random, so replicas never tie)")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering: act even if other operators run (development only)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                        help="kopf liveness endpoint URL (default http://0.0.0.0:8080/healthz)")
    parser.add_argument("--metrics-port", type=int, default=9090,
                        help="port of the operator's /metrics (default 9090; 0 disables)")
    parser.add_argument("--image", default=os.environ.get("KEYRANGE_IMAGE", OperatorSettings.image),
                        help="worker image when a StreamConsumer sets none (default $KEYRANGE_IMAGE)")
    parser.add_argument("--termination-grace-seconds", type=int,
                        default=OperatorSettings.termination_grace_seconds,
                        help="time a worker gets to release its ranges on SIGTERM")
    parser.add_argument("--refresh-seconds", type=float, default=OperatorSettings.reconcile_interval_seconds,
                        help="how often each consumer's workers and status are refreshed")
    parser.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")
    parser.add_argument("--monitoring-label", action="append", default=[], metavar="KEY=VALUE",
                        help="label for ServiceMonitors/PrometheusRules (a Prometheus Operator selector)")
    parser.add_argument("--webhook-port", type=int, default=0,
                        help="serve the Alertmanager webhook (POST /alertmanager/webhook) on this port; "
                             "0 (default) disables it; see docs/autoscaling.md")
    parser.add_argument("--webhook-token", default=None,
                        help="bearer token Alertmanager must send (default $KEYRANGE_WEBHOOK_TOKEN, or "
                             "the file named by $KEYRANGE_WEBHOOK_TOKEN_FILE, e.g. a mounted Secret)")


def settings_from_args(args: argparse.Namespace) -> OperatorSettings:
    """OperatorSettings from the command line; UserError on a malformed value."""
    labels = {}
    for item in args.monitoring_label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--monitoring-label expects KEY=VALUE, got {item!r}")
        labels[key] = value
    try:
        return OperatorSettings(
            image=args.image,
            termination_grace_seconds=args.termination_grace_seconds,
            reconcile_interval_seconds=args.refresh_seconds, monitoring_labels=labels)
    except ValueError as exc:
        raise UserError(f"invalid operator setting: {exc}") from None


def side_services(args: argparse.Namespace, memo: Any) -> list[Coroutine[Any, Any, None]]:
    """Servers that run beside kopf in the same event loop and share its memo.

    The Alertmanager webhook receiver (keyrange.operator.webhook) plugs in here: it finds a
    consumer's range control in `memo.controls` (ControlRegistry), calls `request_scale`, and
    records the outcome with `keyrange.operator.decisions.record_scaling_decision(memo.kube, ...)`.
    """
    if not args.webhook_port:
        return []
    from keyrange.operator.alerting import serve_alert_webhook
    from keyrange.operator.webhook import load_token

    return [serve_alert_webhook(memo, "0.0.0.0", args.webhook_port, load_token(args.webhook_token))]


def check_peering(kube: Any, peering: str, namespaces: list[str]) -> None:
    """Raise UserError when the peering objects kopf needs are missing (kopf would idle silently)."""
    if namespaces:
        missing = [f"KopfPeering {ns}/{peering}" for ns in namespaces
                   if kube.get("kopf.dev/v1", "KopfPeering", ns, peering) is None]
    else:
        missing = [f"ClusterKopfPeering {peering}"] if kube.get(
            "kopf.dev/v1", "ClusterKopfPeering", None, peering) is None else []
    if missing:
        raise UserError(
            f"{', '.join(missing)} not found: install keyrange with its Helm chart (it creates them), "
            "or apply charts/keyrange/crds/kopfpeerings.yaml and create the object, or pass --standalone "
            "to run a single operator without peering")


async def run_operator(args: argparse.Namespace, settings: OperatorSettings) -> None:
    """kopf's operator loop plus the side services, until cancelled or signalled."""
    import kopf

    from keyrange.operator.handlers import operator_memo, register_handlers

    registry = register_handlers(kopf.OperatorRegistry(), settings)
    memo = operator_memo(settings)
    namespaces = list(args.namespace)
    if not args.standalone:
        await asyncio.to_thread(check_peering, memo.kube, args.peering, namespaces)
    tasks = [asyncio.ensure_future(s) for s in side_services(args, memo)]
    try:
        await kopf.operator(
            registry=registry, memo=memo, clusterwide=not namespaces, namespaces=namespaces,
            standalone=args.standalone, peering_name=None if args.standalone else args.peering,
            priority=args.priority,
            liveness_endpoint=args.liveness or None)
    finally:
        for task in tasks:
            task.cancel()
        memo.controls.close_all()


def run(args: argparse.Namespace) -> int:
    """Start the operator; return when it stops."""
    settings = settings_from_args(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    asyncio.run(run_operator(args, settings))
    return 0
