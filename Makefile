# keyrange: two commands on a fresh machine.
#   make demo   runs the local demo on the embedded broker (Apache Kafka where Java 17+ is installed, else tansu)
#   make test   installs everything the tests need, then lint, types and the whole suite
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
# Downloaded and built tools (helm, Kubernetes' binaries); $KEYRANGE_TOOLS shares one cache
# between checkouts.
TOOLS   ?= $(or $(KEYRANGE_TOOLS),$(CURDIR)/.tools)
export KEYRANGE_TOOLS := $(TOOLS)
export PATH := $(CURDIR)/$(VENV)/bin:$(TOOLS)/bin:$(PATH)
export PYSPARK_PYTHON := $(CURDIR)/$(PY)

.PHONY: demo test install install-dev tools kafka kafka-if-java spark-connector lint types pytest bench soak clean lock

# Runtime dependencies at the image's pinned versions (constraints.txt), so the tests run what
# the image ships; the dev tools float.
$(VENV)/.installed-%: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[$*]"
	touch $@

install: $(VENV)/.installed-local,spark

install-dev: $(VENV)/.installed-local,spark,dev

demo: install kafka-if-java
	$(VENV)/bin/keyrange demo

tools:
	bash scripts/install-tools.sh $(TOOLS)

# Only Apache Kafka's jars (Maven Central, into $(TOOLS)/kafka/libs), and Java 17 and Maven (apt) if
# missing: what `keyrange run` and `keyrange demo` need to run their embedded broker on Apache Kafka.
kafka:
	bash scripts/install-kafka.sh $(TOOLS)

# The same where Java 17+ and Maven are already installed; elsewhere it says so and the demo runs on tansu.
kafka-if-java:
	bash scripts/install-kafka.sh $(TOOLS) --if-java

# Spark's Kafka connector at the venv's PySpark version (Maven, cached in .tools/spark-jars); after install.
spark-connector:
	bash scripts/install-spark-connector.sh $(TOOLS) $(PY)

lint: install-dev
	$(VENV)/bin/ruff check src tests benchmarks

types: install-dev
	$(VENV)/bin/mypy

# The tests mostly wait on brokers, so several xdist workers share 2 cores well; tests that use
# one heavy fixture (the kube control plane, the 3-node Kafka, Spark) run on one worker each
# (tests/parallel.py), which also starts the modules with a slow test first, so that none of them
# is left to run alone at the end. PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 4
pytest: install-dev tools spark-connector
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -n $(PYTEST_WORKERS) --dist loadgroup

test: lint types pytest

# Every benchmark on Apache Kafka and on tansu; e.g. BENCH_ARGS="--only ledger --broker kafka".
bench: install-dev tools spark-connector
	$(PY) -m benchmarks $(BENCH_ARGS)

# Many more random handoff schedules than CI runs (tests/integration/test_handoff_random.py);
# SOAK_SEEDS picks them, e.g. `make soak SOAK_SEEDS=100-199`. And the slow broker faults CI leaves
# out: a rolling restart of all three Kafka nodes under load (tests/integration/test_kafka_faults.py).
# And `keyrange run` on its embedded broker (SOAK_ENGINE: kafka or tansu; default keyrange run's, Apache
# Kafka here) under the kata's load for SOAK_MINUTES, latency and lag per minute (benchmarks/soak_embedded.py;
# rows in build/soak-embedded.json), and its few-minute check that lag is never read 0 while events wait
# (tests/integration/test_soak_embedded.py). And the rescale test with 22 rescales under load
# (KEYRANGE_RESCALES; `make test` runs it with 8). Not part of `make test`.
SOAK_SEEDS ?= 1-40
SOAK_MINUTES ?= 60
SOAK_ENGINE ?=
soak: install-dev tools
	KEYRANGE_CHAOS_SEEDS=$(SOAK_SEEDS) $(PY) -m pytest -q -p no:cacheprovider -o timeout=600 \
		tests/integration/test_handoff_random.py
	KEYRANGE_SOAK=1 $(PY) -m pytest -q -p no:cacheprovider -o timeout=900 \
		tests/integration/test_kafka_faults.py -k every-node tests/integration/test_soak_embedded.py
	KEYRANGE_RESCALES=22 $(PY) -m pytest -q -p no:cacheprovider -o timeout=600 tests/integration/test_rescale.py
	mkdir -p build
	$(PY) -m benchmarks.soak_embedded --minutes $(SOAK_MINUTES) --out build/soak-embedded.json \
		--log build/soak-embedded-run.log $(if $(SOAK_ENGINE),--engine $(SOAK_ENGINE))

# Refresh constraints.txt: the newest versions pyproject.toml allows for the image's packages
# (scripts/lock-deps.py); the next `make install` follows it.
lock: install
	$(PY) scripts/lock-deps.py

clean:
	rm -rf $(VENV) $(TOOLS) build *.egg-info
