"""`keyrange worker`: one worker process, on fixed partitions or under the range controller.

With `--partitions` the worker holds exactly those slots (static mode). Without it the slots
come from the consumer's control topic (controlled mode, `keyrange.ranges.membership`), and
`--worker-id` defaults to the StatefulSet ordinal in $HOSTNAME. Settings come from flags, from a
StreamConsumer YAML (`--spec-file`), or both (flags win). SIGTERM/SIGINT stop fetching, finish
in-flight events, commit and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from keyrange.commands.kafkaargs import add_kafka_arguments, kafka_properties
from keyrange.commands.metricsargs import add_metrics_arguments, metrics_listener
from keyrange.errors import UserError
from keyrange.handlers import Handler, load_handler
from keyrange.inputmapping import InputMapping
from keyrange.kafkaio import StopRequested
from keyrange.ranges.slots import format_slot_list, parse_slot_list
from keyrange.spec import load_file
from keyrange.worker import Worker, WorkerSettings
from keyrange.worker.engine import SlotFailure
from keyrange.worker.gcsettings import tune_garbage_collector
from keyrange.worker.health import Health
from keyrange.worker.health import serve as serve_probes
from keyrange.worker.stats import percentiles

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `keyrange worker` (defaults come from --spec-file, then built-in defaults)."""
    parser.add_argument("--spec-file", help="StreamConsumer YAML supplying the settings below (flags override)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers")
    parser.add_argument("--topic", help="input topic")
    parser.add_argument("--group", help="consumer group for committed offsets (default: the spec's groupId/name)")
    parser.add_argument("--partitions", help="slots to hold, e.g. 0-11 or 0,3,5 (omit for controlled mode)")
    parser.add_argument("--handler", help="sleep | ledger | noop | module:function (default sleep)")
    parser.add_argument("--handler-config", help='handler settings as JSON, e.g. \'{"meanMs": 10}\'')
    parser.add_argument("--worker-id", help="stable worker identity (default: derived from the slots, or the "
                                            "StatefulSet ordinal in controlled mode)")
    add_metrics_arguments(parser, "serve Prometheus metrics (/metrics) and the probes (/healthz, /readyz) on this port")
    # The defaults shown are WorkerSettings' own, so that the help cannot drift from them.
    defaults = WorkerSettings
    parser.add_argument("--concurrency", type=int, help=f"handler calls in flight (default {defaults.concurrency})")
    parser.add_argument("--max-pending", type=int,
                        help=f"unfinished events per partition before pausing (default {defaults.max_pending})")
    parser.add_argument("--ttl-seconds", type=float, help=f"dedup window (default {defaults.ttl_seconds:g})")
    parser.add_argument("--max-retries", type=int,
                        help=f"handler retries before dead-lettering (default {defaults.max_retries})")
    parser.add_argument("--max-pending-bytes", type=int,
                        help="bytes of unfinished events per partition before pausing "
                             f"(default {defaults.max_pending_bytes // (1 << 20)} MiB)")
    parser.add_argument("--handler-timeout-seconds", type=float,
                        help="a handler call running this long fails: retried, then dead-lettered "
                             f"(default {defaults.handler_timeout_seconds:g})")
    parser.add_argument("--input-client-id", help="where the clientId is: key | field:<name> | header:<name> "
                        "(default field:clientId)")
    parser.add_argument("--input-uuid", help="where the event id is: field:<name> | header:<name> | none "
                        "(default field:uuid; none turns dedup off)")
    parser.add_argument("--input-created", help="where the event time is: field:<name> | timestamp "
                        "(default field:created)")
    parser.add_argument("--input-format", help="json | raw | module:function decoding the value (default json)")
    parser.add_argument("--sink-topic", help="processed-record topic (default <topic>.processed)")
    parser.add_argument("--dlq-topic", help="dead-letter topic (default <topic>.dlq)")
    parser.add_argument("--commit-interval-ms", type=int,
                        help=f"transaction interval (default {defaults.commit_interval_ms})")
    parser.add_argument("--summary-seconds", type=float, default=5.0,
                        help="print a one-line summary on stderr this often; 0 disables (default 5)")
    parser.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    add_kafka_arguments(parser)


@dataclass(frozen=True)
class WorkerPlan:
    """What to run, after merging the spec file and the flags."""

    settings: WorkerSettings
    handler: Handler
    slots: list[int] | None
    """None: controlled mode."""


def _input_mapping(spec_mapping: InputMapping | None, args: argparse.Namespace) -> InputMapping:
    """The spec's `input` with the --input-* flags over it (UserError naming the problem)."""
    flags = {name: getattr(args, f"input_{name}") for name in ("client_id", "uuid", "created", "format")}
    try:
        mapping = dataclasses.replace(spec_mapping or InputMapping(),
                                      **{name: flag for name, flag in flags.items() if flag is not None})
    except ValueError as exc:
        raise UserError(str(exc)) from None
    mapping.parser  # noqa: B018 - loads a user decoder now, so a missing one stops the worker at start
    return mapping


def _spec_values(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    doc = load_file(path)
    spec = doc.spec
    return {
        "bootstrap": spec.kafka.bootstrap_servers, "topic": spec.kafka.topic, "group": doc.group_id,
        "handler": spec.handler, "handler_config": spec.handler_config, "concurrency": spec.concurrency,
        "max_pending": spec.max_pending, "ttl_seconds": spec.dedup.ttl_seconds, "max_retries": spec.max_retries,
        "max_pending_bytes": spec.max_pending_bytes, "handler_timeout_seconds": spec.handler_timeout_seconds,
        "sink_topic": spec.sink_topic, "dlq_topic": spec.dlq_topic, "consumer_name": doc.name,
        "client_properties": spec.kafka.resolved_client_properties(os.environ),
        "replication_factor": spec.kafka.replication_factor,
        "input_mapping": spec.input.mapping(),
    }


def plan(args: argparse.Namespace) -> WorkerPlan:
    """Merge `--spec-file` and flags into settings; raise UserError naming the problem."""
    if args.summary_seconds < 0:
        raise UserError(f"--summary-seconds must be 0 (no summary) or more, got {args.summary_seconds:g}")
    values = _spec_values(args.spec_file)
    for name in ("bootstrap", "topic", "group", "handler", "concurrency", "max_pending", "ttl_seconds",
                 "max_retries", "sink_topic", "dlq_topic", "max_pending_bytes", "handler_timeout_seconds"):
        flag = getattr(args, name)
        if flag is not None:
            values[name] = flag
    if args.handler_config is not None:
        try:
            values["handler_config"] = orjson.loads(args.handler_config)
        except orjson.JSONDecodeError as exc:
            raise UserError(f"--handler-config is not valid JSON ({exc}); e.g. '{{\"meanMs\": 10}}'") from None
        if not isinstance(values["handler_config"], dict):
            raise UserError("--handler-config must be a JSON object, e.g. '{\"meanMs\": 10}'")
    spec_fields = {"bootstrap": "kafka.bootstrapServers", "topic": "kafka.topic", "group": "kafka.groupId"}
    for required, field in spec_fields.items():
        if not values.get(required):
            if args.spec_file is not None:
                raise UserError(f"{args.spec_file} has no spec.{field}: give --{required}")
            raise UserError(f"--{required} is required (or give --spec-file with it)")
    slots = None
    if args.partitions is not None:
        try:
            slots = parse_slot_list(args.partitions)
        except ValueError as exc:
            raise UserError(f"--partitions: {exc}") from None
    if slots is not None:
        worker_id = args.worker_id or f"slots-{format_slot_list(slots)}"
    else:
        from keyrange.ranges.membership import default_worker_ordinal

        try:
            worker_id = str(default_worker_ordinal(args.worker_id))
        except ValueError as exc:
            raise UserError(f"{exc}; give --worker-id N or --partitions") from None
    client_properties = {**values.get("client_properties", {}), **kafka_properties(args)}
    handler_config = values.get("handler_config") or {}
    handler = load_handler(values.get("handler") or "sleep", handler_config)
    try:
        settings = WorkerSettings(
            bootstrap=values["bootstrap"], topic=values["topic"], group_id=values["group"], worker_id=worker_id,
            consumer_name=values.get("consumer_name"), sink_topic=values.get("sink_topic"),
            dlq_topic=values.get("dlq_topic"), handler_config=handler_config,
            client_properties=client_properties, replication_factor=values.get("replication_factor"),
            input_mapping=_input_mapping(values.get("input_mapping"), args),
            **{k: values[k] for k in ("concurrency", "max_pending", "ttl_seconds", "max_retries", "max_pending_bytes",
                                      "handler_timeout_seconds") if k in values},
            **({"commit_interval_ms": args.commit_interval_ms} if args.commit_interval_ms is not None else {}),
        )
    except ValueError as exc:
        raise UserError(_as_flag(str(exc), args)) from None
    return WorkerPlan(settings, handler, slots)


def _as_flag(message: str, args: argparse.Namespace) -> str:
    """A settings error about a value a flag gave ("max_pending must be ...") named by the flag
    ("--max-pending must be ..."), as the user wrote it."""
    field, _, rest = message.partition(" ")
    if rest and getattr(args, field, None) is not None:
        return f"--{field.replace('_', '-')} {rest}"
    return message


def run(args: argparse.Namespace) -> int:
    """Run the worker until SIGTERM/SIGINT or a fatal error."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = plan(args)
    health = Health()
    listener = metrics_listener(args)
    if listener is not None:
        serve_probes(listener, health)
    tune_garbage_collector()  # the code is loaded: what is alive now stays alive
    asyncio.run(_serve(p, args.summary_seconds, health))
    return 0


async def _serve(p: WorkerPlan, summary_seconds: float, health: Health) -> None:
    # Under a controller the range member acquires a failed slot again if it is still this worker's;
    # static slots are acquired again in place only when the worker gave a stuck producer up.
    on_slot_failure = SlotFailure.RELEASE if p.slots is None else SlotFailure.REACQUIRE_IF_GAVE_UP
    worker = Worker(p.settings, p.handler, health=health, on_slot_failure=on_slot_failure)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    summary = _Summary(worker)
    summary_task = loop.create_task(summary.every(summary_seconds)) if summary_seconds > 0 else None
    try:
        if p.slots is None:
            from keyrange.ranges.membership import run_controlled

            await run_controlled(worker, p.settings.bootstrap, p.settings.group_id, int(p.settings.worker_id), stop,
                                 client_properties=p.settings.client_properties,
                                 replication_factor=p.settings.replication_factor)
        else:
            await _run_static(worker, p.slots, stop)
    except StopRequested:
        pass  # stopped while waiting for Kafka: nothing was held, nothing to commit
    finally:
        if summary_task is not None:
            summary_task.cancel()
        summary.print(0.0, final=True)


async def _run_static(worker: Worker, slots: list[int], stop: asyncio.Event) -> None:
    """Hold `slots` until `stop` is set or the worker fails; then stop gracefully."""
    await worker.start(stop)
    try:
        if slots and max(slots) >= worker.partition_count:
            raise UserError(
                f"topic {worker.settings.topic!r} has {worker.partition_count} partitions but --partitions "
                f"asks for {format_slot_list(slots)}"
            )
        await worker.acquire(slots)
        await _first_of(stop.wait, worker.wait)
    finally:
        await worker.stop()


async def _first_of(*waits: Callable[[], Awaitable[Any]]) -> None:
    tasks = [asyncio.ensure_future(w()) for w in waits]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    for t in done:
        t.result()


class _Summary:
    """The periodic one-line summary on stderr."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.last_processed = 0

    async def every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.print(seconds)

    def print(self, interval_s: float, final: bool = False) -> None:
        s = self.worker.stats
        p50, p99 = percentiles(s.take_latencies(), 0.5, 0.99)
        rate = (s.processed - self.last_processed) / interval_s if interval_s > 0 else 0.0
        self.last_processed = s.processed
        slots = format_slot_list(sorted(self.worker.held_slots)) or "-"
        print(
            f"{'final: ' if final else ''}processed {s.processed:,} ({rate:,.0f}/s)  "
            f"latency p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms  "
            f"pending {s.pending:,}  lag {s.lag_records:,} ({s.lag_seconds:.1f} s)  "
            f"duplicates dropped {s.duplicates:,}  dead letters {s.dead_letters:,}  slots {slots}",
            file=sys.stderr,
            flush=True,
        )
