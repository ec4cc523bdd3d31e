# syntax=docker/dockerfile:1
# One image for every keyrange process: the operator, the workers it starts, and the Spark job.
#   docker build -t keyrange:0.1.0 .
#   docker run --rm keyrange:0.1.0 operator --help
# Workers run `keyrange worker --spec-file ... --metrics-port 9100` (the operator sets the command).

# Pinned by tag: Python 3.11 on Debian 12. Pin a digest too (FROM python:3.11-slim-bookworm@sha256:...)
# when your registry policy asks for it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a self-contained virtualenv with keyrange and its Spark extra ---------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY src ./src
# Every dependency at the version the tests ran with (constraints.txt, `make lock` refreshes it).
RUN python -m venv /opt/keyrange \
 && /opt/keyrange/bin/pip install --upgrade pip \
 && /opt/keyrange/bin/pip install -c constraints.txt ".[spark]" \
 && /opt/keyrange/bin/keyrange --version
# Spark's own Kafka connector at the installed PySpark's version, fetched by Maven into
# /opt/keyrange/tools/spark-jars/<version>/ (the driver and the executors find it there through
# KEYRANGE_TOOLS and hand it to Spark with spark.jars).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends maven openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY scripts/install-spark-connector.sh ./scripts/
COPY scripts/spark-connector ./scripts/spark-connector
RUN bash scripts/install-spark-connector.sh /opt/keyrange/tools /opt/keyrange/bin/python \
 && rm -rf /root/.m2

# --- runtime: the virtualenv, a JRE for Spark, tini, and an unprivileged user ----------------------
FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 keyrange \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin keyrange
COPY --from=build /opt/keyrange /opt/keyrange
ENV PATH=/opt/keyrange/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYSPARK_PYTHON=/opt/keyrange/bin/python \
    KEYRANGE_TOOLS=/opt/keyrange/tools
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# Worker metrics, operator health, operator metrics, alert webhook.
EXPOSE 9100 8080 9090 8081
# tini forwards SIGTERM and reaps children (the Spark job starts a JVM).
ENTRYPOINT ["/usr/bin/tini", "--", "keyrange"]
CMD ["--help"]
