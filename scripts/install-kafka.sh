#!/usr/bin/env bash
# Installs the Apache Kafka broker (KRaft) from Maven Central into TOOLS/kafka/libs: the jars of
# scripts/kafka/pom.xml and their runtime dependencies. Skipped when that pom's jars are already
# there (the stamp file holds the pom's checksum, so a version bump re-fetches).
set -euo pipefail
tools=${1:-.tools}
here=$(cd "$(dirname "$0")" && pwd)
pom="$here/kafka/pom.xml"
dest="$tools/kafka/libs"
stamp="$tools/kafka/.installed"
want=$(sha256sum "$pom" | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dest" ]; then
  exit 0
fi

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  echo "installing java and maven (apt)"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven >/dev/null
fi

echo "installing the Apache Kafka broker jars (maven)"
mkdir -p "$tools/kafka"
tmp=$(mktemp -d "$tools/kafka/libs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp"
ls "$tmp"/kafka_2.13-*.jar >/dev/null
# Swap in the complete set at once, so an interrupted run never leaves a partial libs folder.
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "$want" > "$stamp"
echo "Apache Kafka jars in $dest: $(ls "$dest" | grep -c '\.jar$')"
