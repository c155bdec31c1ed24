# Every target creates and uses its own virtualenv (.venv) pinned by constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

# Default experiment of `make run` (override: make run CLIENTS=20 RUN_CONFIG="method='fedper'")
CLIENTS ?= 10
RUN_CONFIG ?= method='fedavg' dataset='mnist5k' partition='pathological' num-server-rounds=10
# Comparison preset of `make bench` (see conf/)
PRESET ?= conf/mnist5k-pathological.toml

export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1

.PHONY: install run test bench bench-server deploy-local clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m server_app.launch --supernodes $(CLIENTS) --run-config "$(RUN_CONFIG)"

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python -m server_app.compare $(PRESET)

bench-server: $(STAMP)
	$(BIN)/python -m benchmarks.server_time --clients 10,100,1000 --out docs/results/server-time

clean:
	rm -rf $(VENV) results .pytest_cache

deploy-local: $(STAMP)
	$(BIN)/python -m server_app.deploy_local --supernodes 2 --run-config "num-server-rounds=3 dataset='digits' node-wait-s=60"
