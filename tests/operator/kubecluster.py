"""A real Kubernetes control plane for the tests: `scripts/kube-control-plane.sh up/down`, kubectl,
and credentials (the admin's client certificate, a ServiceAccount's token, or a node's or the
scheduler's client certificate from the certificates API).

The binaries are built by `make tools` (never inside pytest); a missing build fails with the fix.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kube-control-plane.sh"
_MINTING = threading.Lock()
"""One certificate minted at a time: two agents asking for the same identity get the same files."""


def tools_dir() -> Path:
    """Where `make tools` put helm and Kubernetes' binaries ($KEYRANGE_TOOLS, else .tools/)."""
    return Path(os.environ.get("KEYRANGE_TOOLS") or ROOT / ".tools")


def kube_bin_dir() -> Path:
    """The folder of kube-apiserver, kube-controller-manager, kubectl and etcd (fails if unbuilt)."""
    env = {**os.environ, "KEYRANGE_TOOLS": str(tools_dir())}
    found = Path(subprocess.run(["bash", str(SCRIPT), "bin"], env=env, capture_output=True, text=True,
                                check=True).stdout.strip())
    if not all((found / b).is_file() for b in ("kube-apiserver", "kube-controller-manager", "kubectl", "etcd")):
        pytest.fail(f"Kubernetes' binaries are not built in {found}: run `make tools` "
                    "(scripts/kube-control-plane.sh build)")
    return found


def helm_binary() -> str:
    """The helm binary `make tools` installed."""
    found = shutil.which("helm") or str(tools_dir() / "bin" / "helm")
    if not os.access(found, os.X_OK):
        pytest.fail("helm is not installed: run `make tools` (scripts/install-tools.sh)")
    return found


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate the cluster's CA signed, with its key and a kubeconfig that presents it."""

    cert: Path
    key: Path
    kubeconfig: Path

    def ssl_context(self, ca: Path) -> ssl.SSLContext:
        """TLS for a test's own HTTP client: trust `ca` (the cluster's), present this certificate."""
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        return context


@dataclass
class ControlPlane:
    """One running control plane (`up DIR`); `down()` stops it."""

    dir: Path
    server: str
    """https://127.0.0.1:PORT of kube-apiserver."""
    kubectl_path: Path
    start_seconds: float
    """How long `up` took (the suite pays it once per session)."""

    @classmethod
    def up(cls, directory: Path) -> ControlPlane:
        """Start etcd, kube-apiserver and kube-controller-manager; wait until ready."""
        bin_dir = kube_bin_dir()
        env = {**os.environ, "KEYRANGE_TOOLS": str(tools_dir())}
        started = time.monotonic()
        result = subprocess.run(["bash", str(SCRIPT), "up", str(directory)], env=env, capture_output=True,
                                text=True, timeout=300)
        if result.returncode != 0:
            subprocess.run(["bash", str(SCRIPT), "down", str(directory)], env=env, check=False)
            raise AssertionError(f"kube-control-plane.sh up failed:\n{result.stdout}\n{result.stderr}")
        server = (directory / "server").read_text().strip()
        return cls(directory, server, bin_dir / "kubectl", time.monotonic() - started)

    def down(self) -> None:
        """Stop everything `up` started."""
        subprocess.run(["bash", str(SCRIPT), "down", str(self.dir)], check=True, timeout=120)

    @property
    def admin_kubeconfig(self) -> Path:
        """The cluster-admin kubeconfig `up` wrote (system:masters)."""
        return self.dir / "admin.kubeconfig"

    def kubectl(self, *args: str, kubeconfig: Path | None = None, stdin: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl (as admin unless `kubeconfig` says otherwise)."""
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.admin_kubeconfig)}
        result = subprocess.run([str(self.kubectl_path), *args], env=env, input=stdin, capture_output=True,
                                text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def apply(self, docs: list[dict[str, Any]] | dict[str, Any], *extra: str) -> str:
        """`kubectl apply -f -` of `docs` as admin; returns kubectl's output."""
        items = docs if isinstance(docs, list) else [docs]
        return self.kubectl("apply", "-f", "-", *extra, stdin=yaml.safe_dump_all(items)).stdout

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Wait until the API server serves a CRD (`kubectl wait` fails while it has no conditions yet)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
            found = self.kubectl("get", "crd", crd, "-o", established, check=False)
            if found.stdout.strip() == "True":
                return
            time.sleep(0.2)
        raise AssertionError(f"CRD {crd} not established after {timeout}s")

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A token for a ServiceAccount, from the TokenRequest API (what a pod gets projected)."""
        return self.kubectl("create", "token", service_account, "-n", namespace,
                            f"--duration={seconds}s").stdout.strip()

    def token_kubeconfig(self, path: Path, token: str) -> Path:
        """Write a kubeconfig that authenticates with `token` (a ServiceAccount's) and return it."""
        ca = base64.b64encode((self.dir / "pki" / "ca.crt").read_bytes()).decode()
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "certificate-authority-data": ca}}],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}],
        }))
        path.chmod(0o600)
        return path

    def admin_ssl(self) -> ssl.SSLContext:
        """TLS for a test's own HTTP client: trust the cluster CA, present the admin certificate."""
        pki = self.dir / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return context

    def node_credentials(self, node: str, folder: Path | None = None) -> ClientCertificate:
        """The credentials a kubelet on Node `node` gets by TLS bootstrap: a client certificate for
        user `system:node:<node>` in group `system:nodes`, which the Node authorizer and the
        NodeRestriction admission plugin confine to that node and its pods."""
        return self.client_certificate(f"system:node:{node}", "system:nodes", folder,
                                       "kubernetes.io/kube-apiserver-client-kubelet")

    def scheduler_credentials(self, folder: Path | None = None) -> ClientCertificate:
        """A client certificate for user `system:kube-scheduler` (the built-in scheduler role: binds pods)."""
        return self.client_certificate("system:kube-scheduler", None, folder, "kubernetes.io/kube-apiserver-client")

    def client_certificate(self, user: str, group: str | None, folder: Path | None, signer: str) -> ClientCertificate:
        """A client certificate for `user` (and `group`), as a real cluster issues one: a key and a
        CertificateSigningRequest for `signer`, approved by the admin and signed by the controller
        manager's signer with the cluster CA (the CA the API server trusts for clients). Kept in
        `folder` (default: the plane's clients/) and reused from there."""
        folder = folder or self.dir / "clients"
        name = user.replace(":", "-")
        key, cert, kubeconfig = folder / f"{name}.key", folder / f"{name}.crt", folder / f"{name}.kubeconfig"
        with _MINTING:
            if not kubeconfig.exists():  # written last: the others are complete
                folder.mkdir(parents=True, exist_ok=True)
                self._mint(user, group, signer, key, cert, kubeconfig)
        return ClientCertificate(cert, key, kubeconfig)

    def _mint(self, user: str, group: str | None, signer: str, key: Path, cert: Path, kubeconfig: Path) -> None:
        name = kubeconfig.stem
        subject = (f"/O={group}" if group else "") + f"/CN={user}"
        request = subprocess.run(
            ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", subject, "-keyout", str(key)], capture_output=True, text=True, check=True, timeout=60).stdout
        csr = f"keyrange-test-{name}-{os.urandom(3).hex()}"
        self.apply({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                    "metadata": {"name": csr},
                    "spec": {"request": base64.b64encode(request.encode()).decode(), "signerName": signer,
                             "usages": ["digital signature", "client auth"]}})
        self.kubectl("certificate", "approve", csr)
        deadline = time.monotonic() + 120
        while True:
            status = json.loads(self.kubectl("get", "csr", csr, "-o", "json").stdout).get("status") or {}
            issued = status.get("certificate")
            if issued:
                break
            failed = [c for c in status.get("conditions") or [] if c["type"] in ("Denied", "Failed")]
            if failed or time.monotonic() > deadline:
                raise AssertionError(f"CSR {csr} for {user} was not signed: {status}")
            time.sleep(0.2)
        cert.write_bytes(base64.b64decode(issued))
        ca = base64.b64encode((self.dir / "pki" / "ca.crt").read_bytes()).decode()
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "test", "cluster": {"server": self.server, "certificate-authority-data": ca}}],
            "users": [{"name": name, "user": {
                "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
                "client-key-data": base64.b64encode(key.read_bytes()).decode()}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}],
        }))
        for secret in (key, kubeconfig):
            secret.chmod(0o600)

    @property
    def ca(self) -> Path:
        """The cluster CA's certificate (it signs the API server's and clients' certificates)."""
        return self.dir / "pki" / "ca.crt"
