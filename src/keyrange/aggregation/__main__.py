"""`python -m keyrange.aggregation ARGS` (or spark-submit of this file) = `keyrange aggregate ARGS`.

The Spark Operator's SparkApplication needs a main file; this is it.
"""

import sys

from keyrange.cli import main

if __name__ == "__main__":
    sys.exit(main(["aggregate", *sys.argv[1:]]))
