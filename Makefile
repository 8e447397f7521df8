# gpulab: `make run` starts the platform on http://127.0.0.1:8000, `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: install run test lint format bench clean

install: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: pyproject.toml extensions/gpulab_spot/pyproject.toml extensions/gpulab_reporter/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "gpulab needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || \
		{ echo "Creating the venv failed: on Debian run 'apt-get install python3-venv'"; exit 1; }
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	$(BIN)/pip install -q --disable-pip-version-check -e extensions/gpulab_spot -e extensions/gpulab_reporter
	@touch $@

node_modules/.installed: package.json
	@command -v npm >/dev/null || { echo "npm (Node.js >= 18) is needed for configurable-http-proxy"; exit 1; }
	npm install --no-audit --no-fund --loglevel=error
	@touch $@

run: install
	$(BIN)/gpulab up $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: install lint
	$(BIN)/pytest $(ARGS)

bench: install
	$(BIN)/python benchmarks/spawn.py $(ARGS)

clean:
	rm -rf $(VENV) node_modules .gpulab .pytest_cache .ruff_cache
