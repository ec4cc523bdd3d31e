"""A StreamConsumer left at its defaults runs its workers at WorkerSettings' defaults.

The spec (keyrange.spec) and WorkerSettings each write the worker's defaults down: the spec for
the CRD and `keyrange run -f`, WorkerSettings for `keyrange worker` without a spec file. The CRD's
copy is tied to the spec's by tests/operator/test_crd.py; this ties the spec's to WorkerSettings',
through the code that maps one onto the other (`keyrange worker --spec-file`).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from keyrange.commands.worker import _spec_values, add_arguments, plan
from keyrange.worker import WorkerSettings

SPEC = """\
apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata: {name: payments}
spec:
  kafka: {bootstrapServers: "127.0.0.1:9092", topic: events}
"""

NOT_SETTINGS = {"group", "handler"}
"""Keys of the mapping that are not WorkerSettings fields: `group` becomes group_id, `handler` the
handler itself."""


def test_a_spec_at_its_defaults_gives_the_worker_settings_defaults(tmp_path: Path) -> None:
    path = tmp_path / "payments.yaml"
    path.write_text(SPEC, encoding="utf-8")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = plan(parser.parse_args(["--spec-file", str(path), "--partitions", "0"])).settings
    reference = WorkerSettings(bootstrap=settings.bootstrap, topic=settings.topic, group_id=settings.group_id)

    fields = {f.name: f for f in dataclasses.fields(WorkerSettings)}
    mapped = set(_spec_values(str(path)))
    assert mapped - NOT_SETTINGS <= set(fields), "the mapping names a field WorkerSettings lacks"
    # A default of None means "derived" (the sink topic from the topic, the metrics label from the
    # group), not a value written down twice.
    has_default = {name for name, f in fields.items()
                   if f.default_factory is not dataclasses.MISSING
                   or f.default not in (dataclasses.MISSING, None)}
    compared = sorted(mapped & has_default)
    assert "max_pending" in compared and "ttl_seconds" in compared, compared
    differing = {name: (getattr(settings, name), getattr(reference, name)) for name in compared
                 if getattr(settings, name) != getattr(reference, name)}
    assert not differing, f"the spec's default (left) is not WorkerSettings' (right): {differing}"
