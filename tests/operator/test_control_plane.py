"""scripts/kube-control-plane.sh: a real control plane that enforces RBAC and runs the controllers."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.operator.kubecluster import SCRIPT, ControlPlane


def test_kubectl_lists_the_system_namespaces(control_plane: ControlPlane) -> None:
    names = control_plane.kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system", "namespace/kube-public"} <= set(names)
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")  # stamped, not v0.0.0


def test_rbac_denies_a_service_account_without_bindings(control_plane: ControlPlane, tmp_path: Path) -> None:
    control_plane.kubectl("create", "namespace", "rbac-check")
    control_plane.kubectl("create", "serviceaccount", "nobody", "-n", "rbac-check")
    kubeconfig = control_plane.token_kubeconfig(tmp_path / "nobody", control_plane.token("rbac-check", "nobody"))
    denied = control_plane.kubectl("get", "pods", "-n", "rbac-check", kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0
    assert 'User "system:serviceaccount:rbac-check:nobody" cannot list resource "pods"' in denied.stderr
    who = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert who["status"]["userInfo"]["username"] == "system:serviceaccount:rbac-check:nobody"


def test_controllers_run(control_plane: ControlPlane) -> None:
    """The service-account, root-CA, StatefulSet and garbage-collector controllers all act."""
    kubectl = control_plane.kubectl
    kubectl("create", "namespace", "controllers")
    kubectl("wait", "--for=create", "serviceaccount/default", "configmap/kube-root-ca.crt", "-n", "controllers",
            "--timeout=60s")
    control_plane.apply({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web", "namespace": "controllers"},
        "spec": {"replicas": 2, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                 "podManagementPolicy": "Parallel",
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "example.invalid/c:1"}]}}}})
    kubectl("wait", "--for=create", "pod/web-0", "pod/web-1", "-n", "controllers", "--timeout=60s")
    kubectl("delete", "statefulset", "web", "-n", "controllers", "--cascade=foreground", "--timeout=60s")
    kubectl("wait", "--for=delete", "pod/web-0", "pod/web-1", "-n", "controllers", "--timeout=60s")


def _port_open(server: str) -> bool:
    host, port = server.removeprefix("https://").split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


@pytest.mark.slow
def test_down_stops_everything_and_is_idempotent(tmp_path: Path) -> None:
    plane = ControlPlane.up(tmp_path / "plane")
    pids = [int(p.read_text()) for p in (tmp_path / "plane" / "pids").glob("*.pid")]
    assert len(pids) == 3 and _port_open(plane.server)
    again = subprocess.run(["bash", str(SCRIPT), "up", str(plane.dir)], capture_output=True, text=True)
    assert again.returncode != 0 and "run 'down" in again.stderr  # never two on one DIR
    plane.down()
    assert not _port_open(plane.server)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} survived down"
    plane.down()  # idempotent
