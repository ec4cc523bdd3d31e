#!/usr/bin/env bash
# Installs the Apache Kafka broker (KRaft) from Maven Central into TOOLS/kafka/libs: the jars of
# scripts/kafka/pom.xml and their runtime dependencies. Skipped when that pom's jars are already
# there (the stamp file holds the pom's checksum, so a version bump re-fetches).
#
#   install-kafka.sh TOOLS             installs Java 17 and Maven (apt) first when missing (make kafka, make tools)
#   install-kafka.sh TOOLS --if-java   only with Java 17+ and Maven already here, and never fails (make demo):
#                                      without them keyrange's embedded broker is tansu, and this says so
set -euo pipefail
tools=${1:-.tools}
mode=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
pom="$here/kafka/pom.xml"
dest="$tools/kafka/libs"
stamp="$tools/kafka/.installed"
want=$(sha256sum "$pom" | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dest" ]; then
  exit 0
fi

java_major() {
  local java=java
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then java="$JAVA_HOME/bin/java"; fi
  command -v "$java" >/dev/null || { echo 0; return; }
  "$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -1 |
    awk '{ print ($1 == 1 ? $2 : $1) }'
}

major=$(java_major)
if [ "$mode" = "--if-java" ]; then
  if [ "${major:-0}" -lt 17 ] || ! command -v mvn >/dev/null; then
    echo "keyrange: no Java 17+ and Maven here, so the embedded broker is tansu (for short runs);" \
         "\`make kafka\` installs them (apt) and Apache Kafka's jars, the embedded default for long runs"
    exit 0
  fi
elif [ "${major:-0}" -lt 17 ] || ! command -v mvn >/dev/null; then
  echo "installing java 17 and maven (apt)"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven >/dev/null
fi

echo "installing the Apache Kafka broker jars (maven)"
mkdir -p "$tools/kafka"
tmp=$(mktemp -d "$tools/kafka/libs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp"; then
  if [ "$mode" = "--if-java" ]; then
    echo "keyrange: Maven could not fetch Apache Kafka's jars (above), so the embedded broker is tansu; \`make kafka\` retries"
    exit 0
  fi
  exit 1
fi
ls "$tmp"/kafka_2.13-*.jar >/dev/null
# Swap in the complete set at once, so an interrupted run never leaves a partial libs folder.
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "$want" > "$stamp"
echo "Apache Kafka jars in $dest: $(ls "$dest" | grep -c '\.jar$')"
