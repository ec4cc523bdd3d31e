#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for the operator tests and for trying the chart:
# etcd, kube-apiserver (RBAC + Node authorization, service-account tokens, the admission plugins a
# real cluster runs) and kube-controller-manager (StatefulSet, garbage collector, service-account
# and token controllers, and the rest of its default set). No kubelet: nothing runs pods.
#
#   scripts/kube-control-plane.sh build      build the binaries once (cached; `make tools` runs it)
#   scripts/kube-control-plane.sh up DIR     start everything, wait until ready, write DIR/admin.kubeconfig
#   scripts/kube-control-plane.sh down DIR   stop what `up DIR` started (idempotent)
#   scripts/kube-control-plane.sh bin        print the directory holding the binaries
#
# The binaries are Kubernetes' and etcd's own, built from the Go module proxy by the module in
# scripts/kube-build/ and cached under $KEYRANGE_TOOLS (default: the project's .tools/).
# DIR holds the PKI, etcd's data, pids/ and logs/. The contract `up DIR` / `down DIR` is used by
# outside checks: keep it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build_module="$here/kube-build"
tools=${KEYRANGE_TOOLS:-$root/.tools}
components=(etcd kube-apiserver kube-controller-manager)

die() { echo "kube-control-plane: $*" >&2; exit 1; }

kube_version() { awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2}' "$build_module/go.mod"; }

bin_dir() {
  # Keyed by the build module's content, so a version bump builds afresh.
  local digest
  digest=$(cat "$build_module/go.mod" "$build_module/go.sum" | sha256sum | cut -c1-10)
  echo "$tools/kube/$(kube_version)-$digest/bin"
}

build() {
  local out version started
  out=$(bin_dir)
  version=$(kube_version)
  [ -n "$version" ] || die "no k8s.io/kubernetes version in $build_module/go.mod"
  if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ] && [ -x "$out/etcd" ] && [ -x "$out/kubectl" ]; then
    link_kubectl "$out"
    return
  fi
  command -v go >/dev/null || die "Go is not installed; it is needed once to build Kubernetes $version (see scripts/kube-build/go.mod)"
  echo "building kube-apiserver, kube-controller-manager, kubectl $version and etcd into $out (once; several minutes)"
  started=$(date +%s)
  mkdir -p "$out.partial"
  # Kubernetes' own build stamps these; without them the server reports v0.0.0 and helm's
  # kubeVersion checks and kubectl's skew checks misjudge it.
  local major minor stamp=""
  major=${version#v}; major=${major%%.*}
  minor=${version#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  # Two cores are shared with everything else on the machine: two compile jobs, lowest priority.
  (cd "$build_module" && GOFLAGS=-mod=readonly nice -n 19 go build -p 2 -trimpath \
      -ldflags "-s -w$stamp" -o "$out.partial/" \
      go.etcd.io/etcd/server/v3 \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubectl)
  # go names a /vN module's binary after the element before the suffix.
  mv "$out.partial/server" "$out.partial/etcd"
  rm -rf "$out"
  mv "$out.partial" "$out"
  echo "built in $(( $(date +%s) - started )) s: $(du -sh "$out" | cut -f1) of binaries in $out"
  link_kubectl "$out"
}

# kubectl on PATH for the Makefile and the tests (the tools bin folder is on PATH there).
link_kubectl() {
  mkdir -p "$tools/bin"
  ln -sfn "$1/kubectl" "$tools/bin/kubectl"
}

# A free port below the kernel's ephemeral range, as keyrange.local.ports.free_port chooses one (this
# script may run without keyrange installed): a port taken from that range (bind to port 0) and
# bound only once etcd or the API server starts can be taken in between by any outgoing connection.
free_port() {
  python3 - <<'PY'
import random, socket
try:
    first = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    first = 32768
candidates = range(10000, first)
for port in random.sample(candidates, min(100, len(candidates))):
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            continue
    print(port)
    break
else:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])
PY
}

# openssl req/x509 wrappers: a CA, then leaf certificates signed by it.
pki() {
  local pki=$1
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=keyrange-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  leaf "$pki" apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
  leaf "$pki" admin "/O=system:masters/CN=keyrange-admin" "extendedKeyUsage=clientAuth"
  leaf "$pki" controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
  leaf "$pki" controller-manager-serving "/CN=kube-controller-manager" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
  # The aggregation layer's front proxy: its own CA, and the client certificate the apiserver
  # presents to extension apiservers.
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=keyrange-test-front-proxy-ca" \
    -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" -keyout "$pki/front-proxy-client.key" \
    -out "$pki/front-proxy-client.csr" 2>/dev/null
  openssl x509 -req -in "$pki/front-proxy-client.csr" -CA "$pki/front-proxy-ca.crt" -CAkey "$pki/front-proxy-ca.key" \
    -CAcreateserial -days 3650 -extfile <(echo "extendedKeyUsage=clientAuth") -out "$pki/front-proxy-client.crt" 2>/dev/null
  rm -f "$pki/front-proxy-client.csr"
  # The service-account token signing pair: the apiserver signs with the private key, verifies
  # with the public one; the controller manager's token controller signs legacy token secrets.
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

leaf() {
  local pki=$1 name=$2 subject=$3 ext=$4
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile <(printf '%s\n' "$ext") -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr"
}

kubeconfig() {
  local file=$1 server=$2 pki=$3 user=$4
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: keyrange-test
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 < "$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 < "$pki/$user.crt")
    client-key-data: $(base64 -w0 < "$pki/$user.key")
contexts:
- name: keyrange-test
  context: {cluster: keyrange-test, user: $user}
current-context: keyrange-test
EOF
  chmod 600 "$file"
}

# Start a component in its own session (so `down` can stop its whole process group), its pid
# and log in DIR.
start() {
  local dir=$1 name=$2; shift 2
  setsid "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/pids/$name.pid"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {
  local what=$1 dir=$2 deadline=$(( $(date +%s) + $3 )); shift 3
  until "$@" >/dev/null 2>&1; do
    for name in "${components[@]}"; do
      if [ -f "$dir/pids/$name.pid" ] && ! alive "$dir/pids/$name.pid"; then
        tail -20 "$dir/logs/$name.log" >&2 || true
        die "$name exited while waiting for $what (log: $dir/logs/$name.log)"
      fi
    done
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out waiting for $what (logs in $dir/logs)"
    sleep 0.2
  done
}

up() {
  local dir=$1 bin started
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  for name in "${components[@]}"; do
    if alive "$dir/pids/$name.pid"; then die "$name from an earlier 'up $dir' is still running: run 'down $dir' first"; fi
  done
  build
  bin=$(bin_dir)
  started=$(date +%s.%N)
  rm -rf "$dir/etcd" "$dir/pki" "$dir/pids" "$dir/logs"
  mkdir -p "$dir/pids" "$dir/logs"
  pki "$dir/pki"
  local pki="$dir/pki"
  local etcd_port etcd_peer_port api_port kcm_port
  etcd_port=$(free_port); etcd_peer_port=$(free_port); api_port=$(free_port); kcm_port=$(free_port)
  local server="https://127.0.0.1:$api_port"

  start "$dir" etcd "$bin/etcd" --name keyrange-test --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "keyrange-test=http://127.0.0.1:$etcd_peer_port" \
    --listen-metrics-urls "" --quota-backend-bytes 1073741824 --log-level warn
  wait_for etcd "$dir" 30 curl -sf "http://127.0.0.1:$etcd_port/health"

  # Admission: the plugins kubeadm-built clusters run by default, plus NodeRestriction and
  # OwnerReferencesPermissionEnforcement (OpenShift runs it: setting blockOwnerDeletion needs
  # update on the owner's finalizers subresource).
  start "$dir" kube-apiserver "$bin/kube-apiserver" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --requestheader-client-ca-file "$pki/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key" \
    --authorization-mode Node,RBAC \
    --anonymous-auth=false \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --api-audiences https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --endpoint-reconciler-type none \
    --enable-admission-plugins NamespaceLifecycle,LimitRanger,ServiceAccount,PodSecurity,Priority,DefaultTolerationSeconds,DefaultStorageClass,StorageObjectInUseProtection,PersistentVolumeClaimResize,RuntimeClass,CertificateApproval,CertificateSigning,ClusterTrustBundleAttest,CertificateSubjectRestriction,DefaultIngressClass,TaintNodesByCondition,NodeRestriction,OwnerReferencesPermissionEnforcement,MutatingAdmissionPolicy,MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook,ResourceQuota \
    --profiling=false --v 1
  kubeconfig "$dir/admin.kubeconfig.partial" "$server" "$pki" admin
  wait_for "kube-apiserver /readyz" "$dir" 120 \
    curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$server/readyz"

  kubeconfig "$dir/controller-manager.kubeconfig" "$server" "$pki" controller-manager
  start "$dir" kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" \
    --tls-cert-file "$pki/controller-manager-serving.crt" --tls-private-key-file "$pki/controller-manager-serving.key" \
    --client-ca-file "$pki/ca.crt" \
    --controllers '*' --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --leader-elect=false --profiling=false --v 1
  wait_for "kube-controller-manager /healthz" "$dir" 60 \
    curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://127.0.0.1:$kcm_port/healthz"
  # The service-account controller has created the default namespace's ServiceAccount: pods can
  # be admitted from here on.
  wait_for "the default ServiceAccount" "$dir" 60 \
    curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
      "$server/api/v1/namespaces/default/serviceaccounts/default"
  mv "$dir/admin.kubeconfig.partial" "$dir/admin.kubeconfig"
  echo "$server" > "$dir/server"
  echo "Kubernetes $(kube_version) up at $server in $(python3 -c "import time; print(round(time.time() - $started, 1))") s"
  echo "  export KUBECONFIG=$dir/admin.kubeconfig   # kubectl: $bin/kubectl"
}

down() {
  local dir=$1
  [ -d "$dir/pids" ] || return 0
  # SIGKILL, all at once: the next `up` wipes etcd's data, so a graceful stop (seconds) keeps nothing.
  local name file pid
  for name in "${components[@]}"; do
    file="$dir/pids/$name.pid"
    # setsid made the pid its process group's leader: stop the group.
    [ -f "$file" ] && kill -KILL -- "-$(cat "$file")" 2>/dev/null || true
  done
  for name in "${components[@]}"; do
    file="$dir/pids/$name.pid"
    [ -f "$file" ] || continue
    pid=$(cat "$file")
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$file"
  done
}

case "${1:-}" in
  build) build ;;
  bin) bin_dir ;;
  up) [ $# -eq 2 ] || die "usage: $0 up DIR"; up "$2" ;;
  down) [ $# -eq 2 ] || die "usage: $0 down DIR"; down "$2" ;;
  *) die "usage: $0 build | bin | up DIR | down DIR" ;;
esac
