# Two commands do everything from a clean clone: `make demo` and `make test`.
# Set-up (virtualenv, packages, service prerequisites) is cached: a second run is fast.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The wheel, built by the build backend (setup.py) with the record path compiled by mypyc
# (onceflow/compiled.py), whose compiled modules are also unpacked in place; rebuilt when a
# file of the package changes (an unchanged record path is not compiled again).
COMPILED := dist/.built
PACKAGE  := $(shell find onceflow -type f -not -path '*/__pycache__/*' -not -name '*.so' \
              -not -name '_compiled.json')

.PHONY: demo test setup prereqs lint unit integration e2e protos bench services-up services-down clean pure

demo: setup
	$(BIN)/onceflow demo

# The suite is mostly waiting (workers joining, kill schedules, outages), so
# TEST_WORKERS processes run it side by side, each with its own services
# (tests/conftest.py). `--maxschedchunk 1` hands each process its next test when it has
# fewer than two queued: by default xdist sent each process a quarter of its share up front
# in collection order, so one process got every SIGKILL test and ran them one after another.
# The Spark tests (marked `spark`) run beside them in one pytest of their own: one Spark
# JVM, one job at a time (their output follows the others'); in that process too, the
# tests that mostly wait (marked `waits`: outages, backoffs), which that lane has time for.
# Tests marked `alone` (their outcome depends on wall-clock pacing) run after, alone.
TEST_WORKERS ?= 4
# Two jobs: the lint runs beside the record path's compile (each uses one core).
MAKEFLAGS += --jobs=2 --output-sync=line
SPARK_LOG := .pytest-spark.log
# The tests' JVMs (Spark, Cassandra) live a minute or two on little data: the C2 compiler and
# parallel GC threads cost more CPU than they save there, CPU the two cores' test processes
# need (one Spark test file: 41.6 -> 25.7 s of CPU, 55 -> 40 s). Tests only: never the
# services a deployment runs.
TEST_JAVA_OPTIONS ?= -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
test: export JAVA_TOOL_OPTIONS = $(TEST_JAVA_OPTIONS)

# The suite starts about 300 worker processes: where Python may write no bytecode
# (PYTHONDONTWRITEBYTECODE, set on some machines) each compiled every module it imports
# again, and could not keep reference.conf's parse either (runtime/parsed_reference.py):
# a start cost 1.85 s of CPU instead of 0.85. The tests let it write them.
test: setup lint
	@export PYTHONDONTWRITEBYTECODE=; \
	$(BIN)/pytest -q --durations=10 -m "(spark or waits) and not alone" tests > $(SPARK_LOG) 2>&1 & spark=$$!; \
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist load --maxschedchunk 1 --durations=25 \
	  -m "not spark and not waits and not alone" tests; rest=$$?; \
	wait $$spark; spark_rc=$$?; \
	echo "--- the Spark tests and the waiting ones:"; cat $(SPARK_LOG); \
	[ $$rest -eq 0 ] && [ $$spark_rc -eq 0 ]
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q --durations=5 -m alone tests

setup: prereqs $(STAMP) $(COMPILED)

prereqs:
	@bash scripts/ensure-prereqs.sh

# The editable install itself stays pure: $(COMPILED) compiles.
$(STAMP): pyproject.toml setup.py | prereqs
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	ONCEFLOW_PURE=1 $(BIN)/pip install -q -e '.[dev,analytics,embedded]'
	touch $(STAMP)

$(COMPILED): $(STAMP) setup.py $(PACKAGE) | prereqs
	$(BIN)/python scripts/compile_stages.py
	touch $(COMPILED)

# Pure Python (to profile the record path with py-spy): `make setup` compiles again.
pure: $(STAMP)
	$(BIN)/python scripts/compile_stages.py --remove
	rm -f $(COMPILED)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy onceflow

unit: $(STAMP) $(COMPILED)
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q tests/integration

e2e: setup
	$(BIN)/pytest -q tests/e2e

# Regenerate the envelope's Python code and type stubs (committed beside the .proto).
protos: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grpc_tools.protoc -I onceflow/protos \
	  --python_out=onceflow/protos --mypy_out=onceflow/protos onceflow/protos/envelope.proto

bench: setup
	$(BIN)/python benchmarks/throughput.py

services-up: setup
	$(BIN)/onceflow services up

services-down: $(STAMP)
	$(BIN)/onceflow services down

clean:
	rm -rf $(VENV) .state .pytest_cache .mypy_cache .ruff_cache .cache/mypyc dist
	rm -f onceflow/stages/*.so onceflow/stages/_compiled.json
