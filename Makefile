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

# Deployment (README "Deployment"): SECURE=1 adds TLS + SuperNode authentication
SUPERNODES ?= 2
SECURE ?=
RUNTIME ?= fast
DEPLOY_CONFIG ?= num-server-rounds=3 dataset='digits' node-wait-s=60
DOCKER_CONFIG ?= method='fedavg' dataset='digits' num-server-rounds=2
CERTS_DIR ?= certs
SUPERLINK_NAMES ?= localhost,127.0.0.1

.PHONY: install data run test bench bench-server deploy-local clean certs deploy-netns docker-setup docker-base \
	docker-run test-deploy bench-deploy bench-deploy-rivals bench-sim readme test-long bench-scale

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[test]"
	@# the optional W&B tracker, for its tests: where the registry lacks it they are skipped with the reason
	-$(BIN)/pip install -q -c constraints.txt -e ".[test,wandb]"
	touch $(STAMP)

# Fashion-MNIST offline from Debian's registry (dataset='fmnist'); needs root and apt-get, and neither
# make run nor make test needs it: without it, dataset='fmnist' is refused at start with the ways to get it
data:
	@test -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz \
	  || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist)

run: $(STAMP)
	$(BIN)/python -m runner.launch --supernodes $(CLIENTS) --run-config "$(RUN_CONFIG)"

# the fast suite (a few minutes on 2 cores): two pytest-xdist workers, one torch thread each, on the CPU; each
# test file goes whole to one worker (--dist loadfile), so a module's shared fixture (one run read by several
# tests) is made once, not once per worker
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --device cpu tests

# the same fast suite on CUDA: every run config, model and test tensor on the GPU (--device cuda); it stops
# at once with "CUDA is not available" on a machine without one. GPU_TEST_WORKERS: processes sharing the GPU
GPU_TEST_WORKERS ?= 4
.PHONY: test-gpu
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -n $(GPU_TEST_WORKERS) --dist loadfile --device cuda tests

bench: $(STAMP)
	$(BIN)/python -m runner.compare $(PRESET)

# one paper preset by name (conf/<P>.toml), reusing the runs it already finished and continuing the ones cut off
# from their checkpoints: make paper P=fedsac-mnist5k-iid
.PHONY: paper tune tables
paper: $(STAMP)
	@test -n "$(P)" || (echo "usage: make paper P=<preset>, one of:"; ls conf | sed -n 's/\.toml$$//p'; exit 2)
	$(BIN)/python -m runner.compare conf/$(P).toml --resume

# the tuning protocol (issue #45): each method's own hyperparameters chosen on validation, once per data family
tune: $(STAMP)
	@test -n "$(P)" || (echo "usage: make tune P=<preset>, one of:"; ls conf | sed -n 's/\.toml$$//p'; exit 2)
	$(BIN)/python -m benchmarks.tune conf/$(P).toml

# every comparison table in docs/results rebuilt from its preset (hours on 2 cores; ONLY=name,name for some),
# then README's and docs' copies refreshed; BENCHMARKS=1 also reruns the speed benchmarks' tables
tables: $(STAMP)
	$(BIN)/python -m benchmarks.tables $(if $(ONLY),--only $(ONLY)) $(if $(BENCHMARKS),--benchmarks) $(if $(ALLOW_DIRTY),--allow-dirty)

bench-server: $(STAMP)
	$(BIN)/python -m benchmarks.server_time --clients 10,100,1000 --out docs/results/server-time

clean:
	rm -rf $(VENV) results .pytest_cache

deploy-local: $(STAMP)
	$(BIN)/python -m runner.deploy_local --supernodes $(SUPERNODES) $(if $(SECURE),--secure) --runtime $(RUNTIME) \
	  --run-config "$(DEPLOY_CONFIG)"

# a CA, the SuperLink's certificate (SANs: SUPERLINK_NAMES) and one key pair per SuperNode
certs: $(STAMP)
	$(BIN)/python -m runner.certs --out $(CERTS_DIR) --supernodes $(SUPERNODES) --names "$(SUPERLINK_NAMES)"

# SuperLink and each SuperNode in a network namespace of its own (root, iproute2)
deploy-netns: $(STAMP)
	$(BIN)/python -m runner.netns --supernodes $(SUPERNODES) $(if $(SECURE),--secure) --runtime $(RUNTIME) \
	  --run-config "$(DEPLOY_CONFIG)"

# Debian's docker engine and compose v1, and mmdebstrap/debootstrap for the local base image (root)
docker-setup:
	command -v dockerd >/dev/null && command -v docker-compose >/dev/null && command -v mmdebstrap >/dev/null \
	  || (apt-get update -q && apt-get install -y -q docker.io docker-compose mmdebstrap debootstrap)

# what every deployment path needs on a bare machine: the docker packages and iproute2 (root)
.PHONY: deploy-setup
deploy-setup: docker-setup
	command -v ip >/dev/null || (apt-get update -q && apt-get install -y -q iproute2)

# the local stand-in for the official flwr/* images (needs a running docker engine)
docker-base: $(STAMP)
	PYTHON=$(BIN)/python docker/build-local-base.sh

# compose stack up (its own dockerd if none runs), one run, results collected, stack down
docker-run: $(STAMP) docker-setup
	$(BIN)/python -m runner.docker_stack $(if $(SECURE),--tls) --run-config "$(DOCKER_CONFIG)"

# every deployment test, the long ones (churn, docker compose, namespaces) included
test-deploy: $(STAMP)
	$(BIN)/python -m pytest -q -m "deploy or long" tests/test_deployment.py tests/test_deployment_nodes.py \
	  tests/test_deployment_docker.py tests/test_deployment_netns.py

# CI's deployment smoke (under 10 minutes on 2 cores, root): a flwr run simulation, SuperLink + 2 SuperNodes
# with TLS and node authentication, network namespaces, docker compose; 2 rounds each on digits. A setup
# that fails does not stop it: each test then fails with what is missing
.PHONY: test-deploy-smoke
test-deploy-smoke: $(STAMP)
	-$(MAKE) --no-print-directory deploy-setup
	$(BIN)/python -m pytest -q --durations=0 -m smoke_deploy tests/test_deploy_smoke.py

# deployed round vs simulated round, fedavg on mnist5k, 2 and 4 SuperNodes (README table)
bench-deploy: $(STAMP)
	$(BIN)/python -m benchmarks.deployed_round --supernodes 2,4 --out docs/results/deployed-round

# every rival in a real deployment (SuperLink + 2 SuperNodes, digits, 2 rounds) and through flwr run (mnist5k,
# pathological, 20 clients, 3 rounds), one method after another (docs/deployment.md table; about 40 min on 2 cores)
bench-deploy-rivals: $(STAMP)
	$(BIN)/python -m benchmarks.deployed_methods --supernodes 2 --flwr-run --out docs/results/deployed-rivals

# flwr run vs the same work sequentially on one thread: fedavg, fedproto, ditto, 20 clients, 50 rounds (README table)
bench-sim: $(STAMP)
	$(BIN)/python -m benchmarks.sim_speed --methods fedavg,fedproto,ditto --clients 20 --rounds 50 --out docs/results/sim-speed

# flwr run at 100 to 10,000 clients beside the in-process round, peak memory per process kind (docs/scale.md); the memory-only table: python -m benchmarks.scale_e2e
bench-scale: $(STAMP)
	$(BIN)/python -m benchmarks.scale_round --clients 100,1000,10000 --rounds 5 --fraction 0.01 --evaluation sampled,all --rounds-all 3 --flower-path 1000 --out docs/results/scale-round

# write pyproject.toml's [tool.flwr.app.config.<method>] tables from the declarations in fedcore/methods/
.PHONY: sync-config
sync-config: $(STAMP)
	$(BIN)/python -m tools.sync_config

# refresh every table of README.md and docs/**/*.md from the table.md its benchmark wrote (<!-- table: path --> blocks)
readme: $(STAMP)
	$(BIN)/python -m benchmarks.summary > /dev/null
	$(BIN)/python -m benchmarks.readme_tables

# mutation testing of the methods, rivals and the machinery behind verdicts (mutmut 3; minutes to an hour a target
# on 2 cores; not in CI): `make mutation` for the five papers, `make mutation METHOD=stats WORKERS=1` for one; reports and
# every target's ratio in docs/results/mutation/
METHOD ?= pfedpm fedmcsa fedfcd mupfl fedsac
.PHONY: mutation
mutation: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e ".[mutation]"
	$(BIN)/python -m tools.mutation $(METHOD) $(if $(WORKERS),--workers $(WORKERS))

# the tests left out of `make test` (minutes each: real flwr runs and deployments, resume after SIGKILL,
# docker compose, namespaces, churn, 1,000 fuzzed replies per method), one at a time
test-long: $(STAMP)
	$(BIN)/python -m pytest -q -m long tests
