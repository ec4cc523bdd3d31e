"""The kopf handlers: thin glue from a StreamConsumer to rendered objects, applied, and status.

Each handler does `spec -> parse_spec -> rendering -> Kube.apply -> status`. They are registered
into a kopf registry by `register_handlers` (not at import), so the refresh interval comes from
OperatorSettings and tests can run the real operator with a short one.

- create / resume / spec update: apply everything the consumer needs (children.py), start the
  consumer's range control, then write status. A spec change changes the pod template's spec
  hash, so the StatefulSet rolls its pods one at a time; each worker releases its ranges on
  SIGTERM, so a rollout is a series of ordinary handoffs.
- `spec.suspend`: the range control stops and the StatefulSet goes to zero; each worker releases
  its ranges and commits on SIGTERM. Status says Suspending, then Suspended. Resuming starts the
  control again, which brings back the workers of its last map.
- a timer per consumer: asks the range control how many workers it needs, scales the StatefulSet,
  reports ready pods back, records the planner's own decisions (an Event and status.lastScaling),
  refreshes status (epoch, ranges, lag, the last handoff's pause, conditions).
- an invalid spec (or one whose pod fields the API server refuses): status Degraded with the
  reason, and kopf.PermanentError so kopf does not retry it (no crash loop) until the spec changes.
- delete: children go with their owner references; the optional delete handler stops the range
  control (kopf keeps its finalizer only because a timer must be stopped before deletion).
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import kopf

from keyrange import metrics
from keyrange.operator import rendering
from keyrange.operator.children import apply_children
from keyrange.operator.decisions import record_planner_decision
from keyrange.operator.kube import Kube, KubeApiError
from keyrange.operator.rangecontrol import RangeControl
from keyrange.operator.registry import ControlRegistry, RangeControlFactory, default_range_control
from keyrange.operator.settings import OperatorSettings
from keyrange.operator.status import Observed, apply_refusal, changed_fields, render_status
from keyrange.spec import SpecError, StreamConsumerSpec, parse_spec

GROUP, VERSION, PLURAL = "keyrange.dev", "v1alpha1", "streamconsumers"
FORBIDDEN_RETRY_SECONDS = 300
"""How long kopf waits before retrying a reconcile the API server refused with 403."""
UNKNOWN_KIND_RETRY_SECONDS = 5
"""How long kopf waits before retrying a reconcile refused because the API server did not know the
owner's kind yet. Its admission checks an owner reference's kind against discovery, which lags a
CRD created moments before (`helm install` and a StreamConsumer applied right after): a 403
"no matches for kind" that goes away within seconds, not a missing permission."""
UNKNOWN_KIND_MARK = "no matches for kind"
Clock = Callable[[], datetime]
Logger = logging.Logger | logging.LoggerAdapter[Any]
log = logging.getLogger(__name__)


def utc_now() -> datetime:
    """The real clock."""
    return datetime.now(UTC)


def operator_memo(settings: OperatorSettings, kube: Kube | None = None,
                  range_control_factory: RangeControlFactory = default_range_control,
                  clock: Clock = utc_now) -> kopf.Memo:
    """The operator-wide memo kopf copies into each consumer's memo (shared values stay shared)."""
    return kopf.Memo(settings=settings, kube=kube or Kube(), controls=ControlRegistry(range_control_factory),
                     clock=clock)


def parse_cluster_spec(name: str, spec: Any, settings: OperatorSettings) -> StreamConsumerSpec:
    """The StreamConsumer's spec as this installation can run it; SpecError says what to change."""
    model = parse_spec(dict(spec), name)
    rendering.check_cluster_spec(name, model)
    if model.aggregation.enabled and not settings.spark_aggregation:
        raise SpecError(f"StreamConsumer {name!r}: spec.aggregation.enabled is true, but this keyrange "
                        "installation runs no Spark jobs (Helm value rbac.sparkAggregation: false); "
                        "set that value to true, or turn aggregation off")
    return model


def _ready(sts: dict[str, Any] | None) -> int:
    return int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)


def _pods(sts: dict[str, Any] | None) -> int:
    """Pods of the StatefulSet that still exist, terminating ones included."""
    return int(((sts or {}).get("status") or {}).get("replicas") or 0)


def _write_status(patch: kopf.Patch, status: Any, seen: Observed, control: RangeControl | None,
                  now: datetime) -> None:
    new = render_status(seen, control.status() if control else None, now, dict(status or {}))
    for key, value in changed_fields(new, dict(status or {})).items():
        patch.status[key] = value


Refusal = tuple[str, str]
"""(message, reason) of an object the API server refused to apply (status.APPLY_REFUSALS)."""


def _remember_apply(memo: Any, generation: int, refusal: Refusal | None) -> None:
    """Keep reconcile's last apply outcome in the consumer's memo, which kopf shares with its refresh
    timer: the timer runs beside reconcile, so status may hold a refresh's older view."""
    memo.last_apply = (generation, refusal)


def _refusal(memo: Any, status: Any, generation: int) -> Refusal | None:
    """The refusal of this generation's apply: this process's own record, else status (a restart)."""
    known: tuple[int, Refusal | None] | None = getattr(memo, "last_apply", None)
    if known is not None and known[0] == generation:
        return known[1]
    return apply_refusal(status, generation)


def _counted(handler: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Count each call in keyrange_operator_reconciles by result."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def counted(**kwargs: Any) -> None:
            try:
                fn(**kwargs)
            except kopf.PermanentError:
                metrics.OPERATOR_RECONCILES.labels(handler, "invalid").inc()
                raise
            except Exception:
                metrics.OPERATOR_RECONCILES.labels(handler, "error").inc()
                raise
            metrics.OPERATOR_RECONCILES.labels(handler, "ok").inc()
        return counted

    return wrap


@_counted("reconcile")
def reconcile(*, name: str, namespace: str | None, body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta,
              status: kopf.Status, patch: kopf.Patch, memo: Any, logger: Logger, **_: Any) -> None:
    """Create or update everything a StreamConsumer needs, then its status."""
    assert namespace is not None  # StreamConsumers are namespaced (the CRD's scope)
    now, generation = memo.clock(), int(meta.get("generation") or 1)
    selector = rendering.selector_string(name)
    try:
        model = parse_cluster_spec(name, spec, memo.settings)
    except SpecError as exc:
        memo.controls.close(namespace, name)
        _write_status(patch, status, Observed(generation, 0, 0, selector, error=str(exc)), None, now)
        raise kopf.PermanentError(str(exc)) from None
    control: RangeControl | None = None
    try:
        with memo.controls.worker_count_lock(namespace, name):
            if model.suspend:
                memo.controls.close(namespace, name)  # no workers: nothing to plan until it resumes
                replicas = 0
            else:
                control = memo.controls.ensure(namespace, name, model)
                assert control is not None  # revive=True always returns one
                replicas = rendering.desired_replicas(model, control.desired_workers())
            metrics.OPERATOR_DESIRED_WORKERS.labels(namespace, name).set(replicas)
            sts = apply_children(memo.kube, memo.settings, body, model, replicas)
    except KubeApiError as exc:
        if exc.status == 403 and UNKNOWN_KIND_MARK in str(exc):
            raise kopf.TemporaryError(f"the API server does not know the kind of an owner reference yet (a CRD created "
                                      f"moments ago); retrying in {UNKNOWN_KIND_RETRY_SECONDS} s: {exc}",
                                      delay=UNKNOWN_KIND_RETRY_SECONDS) from None
        if exc.status == 403:
            # RBAC will not change by retrying soon: say what is missing, retry rarely.
            message = (f"the operator's ServiceAccount is not allowed to do this: {exc}; "
                       "check the chart's rbac values")
            _remember_apply(memo, generation, (message, "Forbidden"))
            _write_status(patch, status, Observed(generation, replicas, 0, selector, error=message,
                                                  error_reason="Forbidden"), control, now)
            raise kopf.TemporaryError(message, delay=FORBIDDEN_RETRY_SECONDS) from None
        if exc.status in (400, 422):
            # Fields the API server checks itself (affinity, topology spread constraints, ...):
            # retrying the same spec cannot help.
            message = (f"the API server refused an object rendered from this StreamConsumer: {exc}; fix the "
                       "worker pod fields of its spec (or the chart's workers values)")
            _remember_apply(memo, generation, (message, "InvalidSpec"))
            _write_status(patch, status, Observed(generation, replicas, 0, selector, error=message), control, now)
            raise kopf.PermanentError(message) from None
        raise
    _remember_apply(memo, generation, None)
    if control is not None:
        control.workers_available(_ready(sts))
    logger.info("applied %s with %d workers", rendering.worker_name(name), replicas)
    seen = Observed(generation, replicas, _ready(sts), selector, suspended=model.suspend, pods=_pods(sts),
                    deduplication=model.input.mapping().dedup)
    _write_status(patch, status, seen, control, now)


@_counted("refresh")
def refresh(*, name: str, namespace: str | None, body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta,
            status: kopf.Status, patch: kopf.Patch, memo: Any, logger: Logger, **_: Any) -> None:
    """Periodically: follow the range control's worker count, record its planner's decisions, and
    refresh status."""
    assert namespace is not None
    if meta.get("deletionTimestamp"):
        return  # being deleted: `forget` stops the control; never start a new one now
    try:
        model = parse_cluster_spec(name, spec, memo.settings)
    except SpecError:
        return  # reconcile already reported it; nothing runs until the spec is fixed
    kube: Kube = memo.kube
    with memo.controls.worker_count_lock(namespace, name):
        sts = kube.get("apps/v1", "StatefulSet", namespace, rendering.worker_name(name))
        if sts is None:
            return  # not created yet (or being deleted): reconcile owns creation
        generation, selector, ready = int(meta.get("generation") or 1), rendering.selector_string(name), _ready(sts)
        if model.suspend:  # reconcile scaled the workers to zero; follow them until the last one is gone
            seen = Observed(generation, 0, ready, selector, suspended=True, pods=_pods(sts),
                            deduplication=model.input.mapping().dedup)
            _write_status(patch, status, seen, None, memo.clock())
            return
        control = memo.controls.ensure(namespace, name, model, revive=False)
        if control is None:
            return  # deleted, or stopped after an invalid spec: only reconcile starts it again
        control.workers_available(ready)
        replicas = rendering.desired_replicas(model, control.desired_workers())
        metrics.OPERATOR_DESIRED_WORKERS.labels(namespace, name).set(replicas)
        current = int((sts.get("spec") or {}).get("replicas") or 0)
        if current != replicas:
            logger.info("scaling %s from %d to %d workers", rendering.worker_name(name), current, replicas)
            kube.patch("apps/v1", "StatefulSet", namespace, rendering.worker_name(name),
                       {"spec": {"replicas": replicas}})
    for decision in control.take_decisions():
        record_planner_decision(kube, dict(body), patch, decision)
    seen = Observed(generation, replicas, ready, selector, pods=_pods(sts), deduplication=model.input.mapping().dedup)
    if (refused := _refusal(memo, status, generation)) is not None:
        # The StatefulSet exists, but reconcile could not apply what came after it.
        seen = replace(seen, error=refused[0], error_reason=refused[1])
    _write_status(patch, status, seen, control, memo.clock())


def forget(*, name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    """The consumer is being deleted: stop its range control (children go by owner reference)."""
    assert namespace is not None
    memo.controls.forget(namespace, name)
    with contextlib.suppress(KeyError):  # never reconciled successfully
        metrics.OPERATOR_DESIRED_WORKERS.remove(namespace, name)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Credentials: the pod's service account in a cluster, else $KUBECONFIG / ~/.kube/config."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


TIMER_EXIT_POLL_SECONDS = 1.0
"""How often kopf looks again whether a refresh that was running when its consumer was deleted has
returned; only then does it remove the finalizer (kopf's default is 60 s)."""


def configure(settings: kopf.OperatorSettings, exact_namespaces: bool = False, **_: Any) -> None:
    """kopf settings: keyrange's own annotation prefix and finalizer name, quiet event posting.

    With `exact_namespaces` (only named namespaces are watched, no patterns), kopf does not scan
    for namespaces: a namespaced install may not list them, and kopf would first retry that for
    about a minute before falling back to the names it was given.
    """
    settings.scanning.disabled = exact_namespaces
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="keyrange.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="keyrange.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "keyrange.dev/operator"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # A deletion that finds the refresh timer running waits for it: look again soon, not in a minute.
    settings.background.cancellation_polling = TIMER_EXIT_POLL_SECONDS


def register_handlers(registry: kopf.OperatorRegistry, settings: OperatorSettings,
                      namespaces: Sequence[str] = ()) -> kopf.OperatorRegistry:
    """Register every handler into `registry` (refresh interval from `settings`; `namespaces` are
    the watched ones, empty for all)."""
    resource = (GROUP, VERSION, PLURAL)
    exact = bool(namespaces) and not any(c in ns for ns in namespaces for c in "*?[!")
    kopf.on.startup(registry=registry, id="configure")(functools.partial(configure, exact_namespaces=exact))
    kopf.on.login(registry=registry)(login)
    for decorator in (kopf.on.resume, kopf.on.create):
        decorator(*resource, registry=registry, id="reconcile")(reconcile)
    kopf.on.update(*resource, registry=registry, id="reconcile", field="spec")(reconcile)
    kopf.timer(*resource, registry=registry, id="refresh", interval=settings.reconcile_interval_seconds,
               initial_delay=settings.reconcile_interval_seconds)(refresh)
    kopf.on.delete(*resource, registry=registry, id="forget", optional=True)(forget)
    return registry
