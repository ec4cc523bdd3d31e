"""What Spark needs on this machine: pyspark, pyarrow and Java (`check_environment`).

Called before anything imports Spark (`run_once`, `start_continuous`, `keyrange aggregate`,
`session.spark_session`), so a missing piece is one line saying what to install, not a traceback.
`connector` raises the same `SparkSetupError` for Spark's Kafka connector.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from keyrange.errors import UserError


class SparkSetupError(UserError, RuntimeError):
    """Spark cannot start here: pyspark, pyarrow or Java is missing."""


def check_environment() -> None:
    """Raise SparkSetupError naming what is missing and how to install it."""
    missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        raise SparkSetupError(
            f"{' and '.join(missing)} not installed; the aggregation job needs the spark extra: "
            "pip install 'keyrange[spark]'"
        )
    java_home = os.environ.get("JAVA_HOME")
    has_java = bool(java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK))
    if not has_java and shutil.which("java") is None:
        raise SparkSetupError(
            "Java is not installed (Spark needs Java 17 or 21); install a JRE "
            "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
