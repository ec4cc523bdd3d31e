"""`keyrange operator`: the kopf operator that reconciles StreamConsumers in a cluster.

Runs kopf's operator loop with keyrange's handlers (keyrange.operator.handlers), a health endpoint
and a Prometheus metrics endpoint. Replicas elect a leader with a Kubernetes Lease
(keyrange.operator.leadership): a standby only answers its health endpoint; the holder runs kopf,
the range controllers and the alert webhook. A holder that cannot renew the Lease stops its
controllers and exits (Kubernetes restarts it as a standby); on SIGTERM it stops them, then
releases the Lease so a standby takes over at once.

Every listener is bound (or taken from the parent, `--*-fd`) before the operator starts, so a port
in use or a bad fd is one line and exit 2, and the webhook's socket stays the same from standby to
leader.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from keyrange.autoscale.rules import RUNBOOK
from keyrange.commands.metricsargs import add_metrics_arguments, bound_socket, inherited_socket, metrics_listener
from keyrange.errors import UserError
from keyrange.operator.settings import OperatorSettings
from keyrange.operator.workerdefaults import WorkerDefaults, load_worker_defaults

if TYPE_CHECKING:
    from keyrange.operator.leadership import LeaseTimings

log = logging.getLogger(__name__)


class LeadershipLost(UserError):
    """The operator could not renew its Lease in time and stopped its controllers."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange operator`."""
    parser.add_argument("-n", "--namespace", action="append", default=[],
                        help="watch this namespace (repeatable; default: all namespaces)")
    parser.add_argument("--lease", default="keyrange",
                        help="name of the Lease the replicas elect their leader with (default keyrange)")
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                        help="namespace of that Lease (default $POD_NAMESPACE, else default)")
    parser.add_argument("--identity", default=None,
                        help="this replica's name in the Lease (default: $POD_NAME or the host name, "
                             "plus a random suffix)")
    parser.add_argument("--lease-seconds", type=float, default=15.0,
                        help="a standby takes over a Lease unrenewed for this long (default 15)")
    parser.add_argument("--lease-renew-deadline-seconds", type=float, default=10.0,
                        help="the leader stops if it could not renew for this long (default 10)")
    parser.add_argument("--lease-retry-seconds", type=float, default=2.0,
                        help="how often the Lease is renewed or retried (default 2)")
    parser.add_argument("--standalone", action="store_true",
                        help="no leader election: act even if other operators run (development only)")
    health = parser.add_mutually_exclusive_group()
    health.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                        help="health endpoint URL, answered by leader and standbys (default http://0.0.0.0:8080/healthz)")
    health.add_argument("--liveness-fd", type=int,
                        help="answer /healthz on this inherited listening socket instead (the parent binds it, so "
                             "no other process can take the port while this one starts)")
    add_metrics_arguments(parser, "port of the operator's /metrics (default 9090; 0 disables)", port_default=9090)
    parser.add_argument("--image", default=os.environ.get("KEYRANGE_IMAGE", OperatorSettings.image),
                        help="worker image when a StreamConsumer sets none (default $KEYRANGE_IMAGE)")
    parser.add_argument("--image-pull-policy", default=OperatorSettings.image_pull_policy,
                        choices=("Always", "IfNotPresent", "Never"),
                        help="pull policy of worker images unless a StreamConsumer sets one (default IfNotPresent)")
    parser.add_argument("--worker-defaults", default=None, metavar="FILE",
                        help="YAML file with every worker pod's defaults: resources, scheduling, pull secrets, "
                             "disruption budget, network policy (the chart's `workers` values; see "
                             "src/keyrange/operator/workerdefaults.py)")
    parser.add_argument("--runbook-url", default=RUNBOOK,
                        help="absolute URL of the alerts' runbook, docs/autoscaling.md (default: this release's on "
                             "GitHub)")
    parser.add_argument("--termination-grace-seconds", type=int,
                        default=OperatorSettings.termination_grace_seconds,
                        help="time a worker gets to release its ranges on SIGTERM")
    parser.add_argument("--refresh-seconds", type=float, default=OperatorSettings.reconcile_interval_seconds,
                        help="how often each consumer's workers and status are refreshed")
    parser.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")
    parser.add_argument("--monitoring-label", action="append", default=[], metavar="KEY=VALUE",
                        help="label for ServiceMonitors/PrometheusRules (a Prometheus Operator selector)")
    parser.add_argument("--spark-driver-cluster-role", default=OperatorSettings.spark_driver_cluster_role,
                        help="ClusterRole that Spark drivers' ServiceAccounts are bound to (the chart's)")
    parser.add_argument("--no-spark-aggregation", dest="spark_aggregation", action="store_false",
                        help="this installation runs no Spark jobs (the chart's rbac.sparkAggregation: "
                             "false): a StreamConsumer asking for aggregation is reported Degraded")
    webhook = parser.add_mutually_exclusive_group()
    webhook.add_argument("--webhook-port", type=int, default=0,
                         help="serve the Alertmanager webhook (POST /alertmanager/webhook) on this port; "
                              "0 (default) disables it; see docs/autoscaling.md")
    webhook.add_argument("--webhook-fd", type=int,
                         help="serve it on this inherited listening socket instead")
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
    defaults = load_worker_defaults(args.worker_defaults) if args.worker_defaults else WorkerDefaults()
    try:
        return OperatorSettings(
            image=args.image, image_pull_policy=args.image_pull_policy, worker_defaults=defaults,
            runbook_url=args.runbook_url,
            termination_grace_seconds=args.termination_grace_seconds,
            spark_aggregation=args.spark_aggregation, spark_driver_cluster_role=args.spark_driver_cluster_role,
            reconcile_interval_seconds=args.refresh_seconds, monitoring_labels=labels)
    except ValueError as exc:
        field, _, rest = str(exc).partition(" ")
        flag = SETTING_FLAGS.get(field)
        raise UserError(f"invalid operator setting: {flag} {rest}" if flag else f"invalid operator setting: {exc}") \
            from None


SETTING_FLAGS = {"reconcile_interval_seconds": "--refresh-seconds", "termination_grace_seconds":
                 "--termination-grace-seconds", "runbook_url": "--runbook-url", "image_pull_policy":
                 "--image-pull-policy", "metrics_port": "--metrics-port"}
"""The flag that sets each OperatorSettings field a settings error names."""


def lease_timings(args: argparse.Namespace) -> LeaseTimings:
    """The leader election's timings from the command line; UserError when they do not fit together."""
    from keyrange.operator.leadership import LeaseTimings

    try:
        return LeaseTimings(args.lease_seconds, args.lease_renew_deadline_seconds, args.lease_retry_seconds)
    except ValueError as exc:
        raise UserError(f"invalid lease timings (--lease-retry-seconds, --lease-renew-deadline-seconds, "
                        f"--lease-seconds): {exc}") from None


@dataclass(frozen=True)
class Listeners:
    """The operator's listening sockets, each None when it serves nothing there."""

    health: socket.socket | None
    """The health endpoint's, answered by leader and standbys."""
    health_path: str
    """The path the health endpoint answers (the --liveness URL's, /healthz with --liveness-fd)."""
    metrics: socket.socket | None
    """Prometheus /metrics, served in a thread of its own (keyrange.worker.health)."""
    webhook: socket.socket | None
    """The alert webhook's: the standby's refusals, then the leader's receiver."""


def listeners(args: argparse.Namespace) -> Listeners:
    """The sockets the options give; UserError for an fd that is not a socket (checked before any
    port is bound) or a port that cannot be bound."""
    health = inherited_socket("--liveness-fd", args.liveness_fd) if args.liveness_fd is not None else None
    webhook = inherited_socket("--webhook-fd", args.webhook_fd) if args.webhook_fd is not None else None
    metrics = metrics_listener(args)
    url = urlparse(args.liveness)
    if health is None and args.liveness:
        health = bound_socket("health", url.port or 8080, url.hostname or "0.0.0.0")
    if webhook is None and args.webhook_port:
        webhook = bound_socket("the alert webhook", args.webhook_port, "0.0.0.0")
    return Listeners(health, url.path or "/healthz", metrics, webhook)


def side_services(memo: Any, webhook: socket.socket | None, token: str | None) -> list[Coroutine[Any, Any, None]]:
    """Servers that run beside kopf in the same event loop and share its memo.

    The Alertmanager webhook receiver (keyrange.autoscale.receiver) plugs in here, on `webhook`
    (None: no receiver) with `token` (--webhook-token): it finds a consumer's range control in
    `memo.controls` (ControlRegistry), calls `request_scale`, and records the outcome with
    `keyrange.operator.decisions.record_scaling_decision(memo.kube, ...)`.
    """
    if webhook is None:
        return []
    from keyrange.autoscale.receiver import load_token
    from keyrange.operator.scalewebhook import serve_alert_webhook

    return [serve_alert_webhook(memo, webhook, load_token(token))]


def identity(args: argparse.Namespace) -> str:
    """This replica's holderIdentity: unique even when a pod restarts under the same name."""
    base = args.identity or os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


async def _serve(app: Any, listener: socket.socket) -> Any:
    """Serve an aiohttp app on a copy of `listener`: its runner's cleanup leaves `listener` open."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, listener.dup()).start()
    return runner


async def serve_health(listener: socket.socket, path: str, state: dict[str, str]) -> Any:
    """Answer GET <path> with 200 and this replica's role, for leader and standbys alike."""
    from aiohttp import web

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response(state)

    app = web.Application()
    app.router.add_get(path, healthz)
    return await _serve(app, listener)


async def serve_standby_webhook(listener: socket.socket, lease: str) -> Any:
    """While standing by, answer the alert webhook with 503: only the Lease holder acts on alerts,
    and Alertmanager retries a 5xx (reaching the leader through the Service sooner or later)."""
    from aiohttp import web

    from keyrange.autoscale.receiver import WEBHOOK_PATH

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": f"this keyrange operator replica is a standby (Lease {lease}); "
                                           "only the leader handles alerts: retry"},
                                 status=503, headers={"Retry-After": "2"})

    app = web.Application()
    app.router.add_post(WEBHOOK_PATH, refuse)
    return await _serve(app, listener)


async def run_operator(args: argparse.Namespace, settings: OperatorSettings, sockets: Listeners) -> None:
    """Elect a leader, then run kopf and the side services until signalled or the Lease is lost."""
    from keyrange.operator.handlers import operator_memo
    from keyrange.operator.leadership import LeaseElector

    memo = operator_memo(settings)
    state = {"role": "standby", "identity": identity(args)}
    health = await serve_health(sockets.health, sockets.health_path, state) if sockets.health else None
    stop = threading.Event()
    try:
        if args.standalone:
            state["role"] = "leader"
            await _lead(args, settings, sockets, memo, state, None, stop)
            return
        timings = lease_timings(args)
        elector = LeaseElector(memo.kube, args.lease_namespace, args.lease, state["identity"], timings)
        # While leading, no API call may outlive the renew deadline (a silent network hangs calls).
        memo.kube.deadline = elector.act_until
        standby = await serve_standby_webhook(sockets.webhook, args.lease) if sockets.webhook else None
        log.info("standing by for Lease %s/%s as %s", args.lease_namespace, args.lease,
                                         state["identity"])
        try:
            if not await asyncio.to_thread(elector.campaign, stop):
                return
        finally:
            if standby is not None:
                await standby.cleanup()  # the leader's receiver serves the same socket
        state["role"] = "leader"
        await _lead(args, settings, sockets, memo, state, elector, stop)
    finally:
        stop.set()
        if health is not None:
            await health.cleanup()


async def _lead(args: argparse.Namespace, settings: OperatorSettings, sockets: Listeners, memo: Any,
                state: dict[str, str], elector: Any, stop: threading.Event) -> None:
    import kopf

    from keyrange.operator.handlers import register_handlers

    loop = asyncio.get_running_loop()
    lost = asyncio.Event()

    def on_lost() -> None:
        # In the elector's thread, without waiting for the event loop: nothing may keep acting.
        memo.controls.stop_all()
        state["role"] = "lost"
        log.error("stopped every range control after losing the Lease")
        loop.call_soon_threadsafe(lost.set)

    holder = None
    if elector is not None:
        holder = threading.Thread(target=elector.hold, args=(stop, on_lost), name="lease", daemon=True)
        holder.start()
    services = [asyncio.ensure_future(s) for s in side_services(memo, sockets.webhook, args.webhook_token)]
    namespaces = list(args.namespace)
    kopf_stop: asyncio.Future[None] = loop.create_future()
    registry = register_handlers(kopf.OperatorRegistry(), settings, namespaces)
    operator = asyncio.ensure_future(kopf.operator(
        registry=registry, memo=memo, clusterwide=not namespaces, namespaces=namespaces, standalone=True,
        stop_flag=kopf_stop))
    watch_lost = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait({operator, watch_lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_lost.cancel()
        for task in services:
            task.cancel()
        memo.controls.stop_all()  # before the Lease is released below
        if not kopf_stop.done():
            kopf_stop.set_result(None)
        await asyncio.wait({operator}, timeout=30)
        stop.set()
        if holder is not None:
            await asyncio.to_thread(holder.join)  # releases the Lease when still holding it
    if lost.is_set():
        raise LeadershipLost(f"lost the Lease {args.lease_namespace}/{args.lease} (not renewed for "
                             f"{args.lease_renew_deadline_seconds} s); stopped every controller and exiting, "
                             "to be restarted as a standby")


def run(args: argparse.Namespace) -> int:
    """Start the operator; return when it stops."""
    settings = settings_from_args(args)
    if not args.standalone:
        lease_timings(args)  # before the API server is reached
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    sockets = listeners(args)
    if sockets.metrics is not None:
        from keyrange.worker.health import serve

        serve(sockets.metrics, None)
    asyncio.run(run_operator(args, settings, sockets))
    return 0
