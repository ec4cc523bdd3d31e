#!/usr/bin/env bash
# Installs Spark's own Kafka connector (spark-sql-kafka-0-10_2.13) at the installed PySpark's
# version into TOOLS/spark-jars/<version>/: the jars of scripts/spark-connector/pom.xml's runtime
# closure that PySpark does not ship itself (spark-sql-kafka, spark-token-provider-kafka,
# kafka-clients, commons-pool2), fetched by Maven (cached in ~/.m2). keyrange hands them to Spark
# with `spark.jars` (see keyrange.aggregation.connector). Usage: install-spark-connector.sh TOOLS [PYTHON]
set -euo pipefail
tools=$(mkdir -p "${1:-.tools}" && cd "${1:-.tools}" && pwd)  # absolute: Maven resolves paths against the pom
python=${2:-python3}
here=$(cd "$(dirname "$0")" && pwd)
pom="$here/spark-connector/pom.xml"

if ! "$python" -c 'import pyspark' 2>/dev/null; then
  echo "$python has no pyspark: install keyrange's spark extra first (make install)" >&2
  exit 1
fi
pyspark_jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
version=$("$python" -c 'import pyspark; print(pyspark.__version__)')
dest="$tools/spark-jars/$version"
stamp="$dest/.installed"
want=$(sha256sum "$pom" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if ! command -v mvn >/dev/null; then
  echo "installing maven (apt)"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends maven >/dev/null
fi

echo "installing Spark's Kafka connector $version (maven)"
mkdir -p "$tools/spark-jars"
tmp=$(mktemp -d "$tools/spark-jars/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! mvn -q -B -Dstyle.color=never -f "$pom" -Dspark.version="$version" dependency:copy-dependencies \
    -DincludeScope=runtime -Dmdep.stripVersion=false -DoutputDirectory="$tmp/all"; then
  echo "Maven could not fetch org.apache.spark:spark-sql-kafka-0-10_2.13:$version; the connector must match" \
       "PySpark exactly: install a PySpark whose connector Maven Central serves (pyproject.toml pins one)" >&2
  exit 1
fi
mkdir -p "$tmp/keep"
# Keep what PySpark lacks: a second copy of a jar it ships (another version of lz4, slf4j, scala,
# hadoop) would put two versions of the same classes on Spark's classpath.
for jar in "$tmp"/all/*.jar; do
  name=$(basename "$jar")
  artifact=$(echo "$name" | sed -E 's/-[0-9][0-9A-Za-z._]*(-[0-9A-Za-z._]+)?\.jar$//')
  if ! ls "$pyspark_jars" | grep -Eq "^${artifact//./\\.}-[0-9]"; then
    cp "$jar" "$tmp/keep/"
  fi
done
ls "$tmp"/keep/spark-sql-kafka-0-10_2.13-*.jar >/dev/null
rm -rf "$dest"
mv "$tmp/keep" "$dest"
echo "$want" > "$stamp"
echo "Spark's Kafka connector in $dest: $(ls "$dest" | tr '\n' ' ')"
