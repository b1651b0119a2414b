# Two commands do everything on a fresh Debian machine: `make run` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONF ?= conf/namesrv.properties
PYTEST_ARGS ?=

.PHONY: setup run run-node run-ha lint test test-unit bench chaos stop clean

setup: $(STAMP)
	@bash infra/install.sh
	@bash infra/jvm/resolve.sh
	@bash tests/peers/install.sh

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) 2>/dev/null \
		|| { echo "installing Debian's python3-venv"; apt-get -q -y install python3-venv >/dev/null && $(PY) -m venv $(VENV); }
	@$(BIN)/pip install --quiet --upgrade pip
	@echo "installing the project and its pinned dependencies into $(VENV) (first time takes a few minutes)"
	@$(BIN)/pip install --quiet -e '.[streaming,local,test]'
	@touch $(STAMP)

# Kafka, Redis, two name-server nodes (9876, 9877) and the Spark job, in the foreground; Ctrl-C stops all.
run: setup
	@$(BIN)/python -m infra.stack up

# the replicated topology of docs/deploy.md: three Kafka nodes, Redis Cluster with replicas, a Spark cluster,
# three nodes, Apache RocketMQ's controller-mode brokers; Ctrl-C or `make stop` stops all
run-ha: setup
	@$(BIN)/python -m infra.stack up --topology ha --rocketmq

# one node alone, as Apache RocketMQ's NameServer runs
run-node: setup
	$(BIN)/namesrv start -c $(CONF)

# formatting, lint and types (configured in pyproject.toml); `make test` runs it first
lint: setup
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy common namesrv streaming infra

# two modules at a time (pytest-xdist; each module stays on one worker, with its stack), then the modules
# marked `alone` one after another, so that what times itself has the machine. Fails if either part fails;
# a part that PYTEST_ARGS left without tests (pytest's exit 5) is no failure unless both are, or
# PYTEST_ARGS is empty
TEST_WORKERS ?= 2
test: lint
	@rc=0; ran=0; \
	part() { $(BIN)/python -m pytest "$$@" $(PYTEST_ARGS); s=$$?; [ $$s -eq 5 ] || ran=1; \
		if [ $$s -ne 0 ] && { [ $$s -ne 5 ] || [ $(words $(PYTEST_ARGS)) -eq 0 ]; }; then rc=$$s; fi; }; \
	part -n $(TEST_WORKERS) --dist loadfile -m "not alone"; \
	part -m alone; \
	if [ $$ran -eq 0 ] && [ $$rc -eq 0 ]; then echo "no test ran: PYTEST_ARGS selected none"; rc=5; fi; \
	exit $$rc

# the quick loop: tests/unit less the slow-marked tests (`make test` runs them); caches bytecode despite PYTHONDONTWRITEBYTECODE
test-unit: setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest tests/unit -m "not slow" $(PYTEST_ARGS)

# writes bench/RESULTS.md (name server vs rmq-echo and Java) and bench/STREAMING_RESULTS.md (the monitor)
bench: setup
	$(BIN)/python bench/namesrv_bench.py --runs 3
	$(BIN)/python bench/streaming_bench.py

# the replicated topology under the seeded fault schedule, one fault at a time; writes bench/CHAOS_RESULTS.md
CHAOS_SEED ?= 1
chaos: setup
	$(BIN)/python bench/chaos.py --rocketmq --seed $(CHAOS_SEED)

stop:
	@$(BIN)/python -m infra.stack down

clean: stop
	rm -rf run build $(VENV)
