# The two commands of the quick start: `make demo` and `make test` (`make fast`, `make unit`: parts of it).
# All do their own set-up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# numba compiles each kernel once per machine; keep its cache in the checkout
export NUMBA_CACHE_DIR := $(CURDIR)/.numba-cache
# compute threads, not BLAS threads, are the unit of parallelism
export OPENBLAS_NUM_THREADS ?= 1

DEMO_ARGS ?= --model lenet5 --algorithm mixbp --workers 2 --local

.PHONY: demo test fast unit venv perf report clean

$(BIN)/python:
	deploy/ensure-packages.sh python3-venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.base
	$(BIN)/pip install -q -e '.[test,perf]'
	touch $@

venv: $(VENV)/.base

demo: $(VENV)/.base
	deploy/ensure-packages.sh dataset-fashion-mnist
	$(BIN)/streamnet-submit train $(DEMO_ARGS)

# the tests run against a real ZooKeeper, started here and stopped afterwards (even on failure)
ZK_DIR  := $(CURDIR)/.run/zookeeper-test
ZK_PORT ?= 22181
test: $(VENV)/.test
	deploy/ensure-packages.sh dataset-fashion-mnist zookeeper chromium chromium-driver
	deploy/zookeeper.sh stop --dir $(ZK_DIR) >/dev/null 2>&1 || true
	rm -rf $(ZK_DIR)
	deploy/zookeeper.sh start --dir $(ZK_DIR) --port $(ZK_PORT) >/dev/null
	STREAMNET_TEST_ZK=127.0.0.1:$(ZK_PORT) $(BIN)/python -m pytest -ra $(PYTEST_ARGS); rc=$$?; \
	  deploy/zookeeper.sh stop --dir $(ZK_DIR); exit $$rc

unit: $(VENV)/.test
	$(BIN)/python -m pytest -ra tests/unit $(PYTEST_ARGS)

# `make test` without the tests marked slow (training on the real dataset; faults on worker
# processes, ZooKeeper and the network): the part a developer runs between commits; CI runs
# `make test`, all of it
fast: PYTEST_ARGS += -m "not slow"
fast: test

# the system's claims measured on this machine (about 10 minutes): docs/report/
report: $(VENV)/.test
	deploy/ensure-packages.sh dataset-fashion-mnist zookeeper
	$(BIN)/python perf/report.py $(REPORT_ARGS)

perf: $(VENV)/.test
	$(BIN)/python perf/kernels.py

clean:
	rm -rf $(VENV) .numba-cache .pytest_cache
