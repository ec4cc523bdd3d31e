"""Spark's own Kafka connector (`format("kafka")`): where its jars are, and how Spark gets them.

The connector is a jar, `org.apache.spark:spark-sql-kafka-0-10_2.13`, that must match PySpark's
version exactly, plus its dependencies that PySpark does not ship (spark-token-provider-kafka,
kafka-clients, commons-pool2). `scripts/install-spark-connector.sh` fetches them with Maven into
`<tools>/spark-jars/<pyspark version>/` (`make tools` runs it; the Docker image carries them), and
`spark_jars_conf` hands them to Spark with `spark.jars`. Users who prefer Spark to fetch them
itself pass `spark.jars.packages` instead (see docs/aggregation.md), and then nothing is added.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from keyrange.aggregation.environment import SparkSetupError
from keyrange.toolsdir import tools_dir

ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
JARS_ENV = "KEYRANGE_SPARK_JARS"
"""A folder holding the connector's jars; wins over the tools folder (`$KEYRANGE_TOOLS`)."""


IMAGE_TOOLS = "/opt/keyrange/tools"
"""The tools folder inside keyrange's Docker image (the Dockerfile installs the connector there)."""


def pyspark_version() -> str:
    """The installed PySpark's version (the connector must be this very version); read from the
    package's metadata, so it costs no import of pyspark."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyspark")
    except PackageNotFoundError:
        raise SparkSetupError("pyspark is not installed; the aggregation job needs the spark extra: "
                              "pip install 'keyrange[spark]'") from None


def image_classpath(version: str | None = None) -> str:
    """The connector's jars inside keyrange's image, as a JVM classpath entry (`folder/*`): what a
    driver or executor started by spark-submit from that image puts on its classpath."""
    return f"{IMAGE_TOOLS}/spark-jars/{version or pyspark_version()}/*"


def package_coordinate(version: str | None = None) -> str:
    """The connector's Maven coordinate, as `spark.jars.packages` takes it."""
    return f"{ARTIFACT}:{version or pyspark_version()}"


def _candidates(version: str) -> list[Path]:
    found = []
    configured = os.environ.get(JARS_ENV)
    if configured:
        found.append(Path(configured))
    found.append(tools_dir() / "spark-jars" / version)
    return found


def connector_jars(version: str | None = None) -> list[Path] | None:
    """The connector's jars for `version` (default: PySpark's), or None when none are installed."""
    version = version or pyspark_version()
    for folder in _candidates(version):
        jars = sorted(folder.glob("*.jar"))
        if any(j.name.startswith(f"spark-sql-kafka-0-10_2.13-{version}") for j in jars):
            return jars
    return None


def asks_for_packages(conf: Mapping[str, str]) -> bool:
    """True when the user's Spark settings already bring the connector (`spark.jars.packages` or
    a `spark.jars` naming it)."""
    return "spark-sql-kafka" in conf.get("spark.jars.packages", "") + conf.get("spark.jars", "")


def spark_jars_conf(conf: Mapping[str, str], required: bool) -> dict[str, str]:
    """The `spark.jars` setting that adds the connector to `conf`'s (empty if the user brings it).

    With `required`, raise SparkSetupError saying how to install it when it is not found.
    """
    if asks_for_packages(conf):
        return {}
    version = pyspark_version()
    jars = connector_jars(version)
    if jars is None:
        if not required:
            return {}
        where = " or ".join(str(c) for c in _candidates(version))
        raise SparkSetupError(
            f"Spark's Kafka connector ({package_coordinate(version)}) is not in {where}: run `make tools` "
            "in the keyrange checkout (scripts/install-spark-connector.sh fetches it with Maven), set "
            f"{JARS_ENV} to a folder of its jars, or let Spark fetch it: --conf "
            f"spark.jars.packages={package_coordinate(version)}"
        )
    listed = [str(j) for j in jars]
    if conf.get("spark.jars"):
        listed.insert(0, conf["spark.jars"])
    return {"spark.jars": ",".join(listed)}
