"""The README's "Run it on Kubernetes" commands, run verbatim against a real API server of this
module's own (it installs the CRD): Helm owns the CRD, so no step is refused, the release's
operator rolls out, the example StreamConsumer is admitted and listed; then the CRD so installed
judges `spec.input` as spec.py does.

The node agent reports the operator's pod Ready without running it (what `rollout status` waits
for); what the operator then does is the other operator tests' subject.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.operator.conftest import admin_api
from tests.operator.kubecluster import ROOT, ControlPlane, helm_binary
from tests.operator.node_agent import TestNodeAgent

SECTION = re.compile(r"## Run it on Kubernetes\n\n```sh\n(.*?)```", re.S)


def readme_commands() -> list[str]:
    """The section's commands, each without its shell comment."""
    block = SECTION.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert block, "README.md has no 'Run it on Kubernetes' sh block"
    return [line.split("  #")[0].strip() for line in block[1].splitlines() if line.strip()]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own: the README's release installs the CRD."""
    started = ControlPlane.up(tmp_path_factory.mktemp("readme-kube"))
    try:
        yield started
    finally:
        started.down()


@pytest.mark.slow
async def test_the_readme_installs_keyrange_as_written(plane: ControlPlane, tmp_path: Path) -> None:
    commands = readme_commands()
    assert commands[0].startswith("helm install") and "kubectl apply -f crds/" not in commands
    namespace = re.search(r"-n (\S+)", commands[0])
    assert namespace
    env = {**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig),
           "PATH": f"{Path(helm_binary()).parent}:{plane.kubectl_path.parent}:{os.environ['PATH']}",
           **{f"HELM_{k}_HOME": str(tmp_path / "helm" / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    async with admin_api(plane, "127.0.0.1:9", "unused") as api, \
            TestNodeAgent(api, [namespace[1]], tmp_path / "node", processes=False):
        outputs = []
        for command in commands:
            done = await asyncio.to_thread(subprocess.run, ["bash", "-c", command], cwd=ROOT, env=env,
                                           capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"{command!r} failed:\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
    assert "successfully rolled out" in outputs[1]
    assert outputs[-1].splitlines()[-1].split()[0] == "events", outputs[-1]  # examples/streamconsumer.yaml

    # The CRD the README installed admits the input-mapping examples (docs/input.md) and refuses
    # format raw with a field mapping; the API server evaluates CEL on defaults unlike crd_schema.py.
    for example in ("existing-topic.yaml", "existing-topic-decoder.yaml"):
        plane.kubectl("apply", "--dry-run=server", "-f", str(ROOT / "examples" / example))
    raw_with_field = {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer", "metadata": {"name": "raw"},
                      "spec": {"kafka": {"topic": "t"}, "input": {"format": "raw", "clientId": "key"}}}
    refused = plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(raw_with_field), check=False)
    assert refused.returncode != 0 and "input.format raw hands the value's bytes" in refused.stderr, refused.stderr
