# gpulab: `make run` starts the platform on http://127.0.0.1:8000, `make test` runs the whole suite.
# A root hub runs each user's server as that user's own Unix account, which must be able to run
# this Python: prefer the system's interpreter (under /usr) to one in a private home (pyenv in
# /root, mode 0700).
PYTHON ?= $(shell for p in /usr/bin/python3 python3; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: install run test lint format bench bench-apps bench-swarm bench-class bench-ssh bench-metrics bench-jobs clean labext-test

# The install steps print one line each: on a fresh machine their own output (Yarn's alone was
# 2,361 lines) buried how to log in, which `make run` prints last. A step's whole output goes to
# $(LOGS)/STEP.log, and its last 60 lines are shown if it fails. VERBOSE=1 shows it all as it runs.
LOGS := $(VENV)/make-logs
VERBOSE ?=
ifeq ($(VERBOSE),)
quietly = @mkdir -p $(LOGS) && echo "make: $(1)" && { ( $(3) ) >$(LOGS)/$(2).log 2>&1 || { status=$$?; \
	tail -n 60 $(LOGS)/$(2).log; echo "make: FAILED: $(1) (exit $$status); all its output: $(LOGS)/$(2).log"; \
	exit $$status; }; }
else
quietly = $(3)
endif

install: $(VENV)/.installed node_modules/.installed $(VENV)/.labext-installed $(VENV)/.code-server-installed

$(VENV)/.installed: pyproject.toml extensions/gpulab_spot/pyproject.toml extensions/gpulab_reporter/pyproject.toml \
		extensions/gpulab_sd_webui/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "gpulab needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || \
		{ echo "Creating the venv failed: on Debian run 'apt-get install python3-venv'"; exit 1; }
	$(call quietly,installing gpulab and its Python packages into $(VENV),pip,\
		$(BIN)/pip install -q --disable-pip-version-check -e '.[test]' && \
		$(BIN)/pip install -q --disable-pip-version-check -e extensions/gpulab_spot \
			-e extensions/gpulab_reporter -e extensions/gpulab_sd_webui)
	@touch $@

node_modules/.installed: package.json
	@command -v npm >/dev/null || { echo "npm (Node.js >= 18) is needed for configurable-http-proxy"; exit 1; }
	$(call quietly,installing configurable-http-proxy (npm),npm,npm install --no-audit --no-fund --loglevel=error)
	@touch $@

# VS Code in the browser (the catalog's vscode app): code-server from npm, built here with
# Debian's ripgrep (images/code-server/install.sh). Optional: where it cannot be built the app is
# not offered (the step says why; remove $(VENV)/.code-server-installed to try again).
$(VENV)/.code-server-installed: images/code-server/install.sh $(VENV)/.installed
	@mkdir -p $(LOGS) && echo "make: installing code-server (the VS Code app) into $(VENV)"
	@sh images/code-server/install.sh $(VENV) >$(LOGS)/code-server.log 2>&1 || { \
		tail -n 20 $(LOGS)/code-server.log; \
		echo "make: code-server did not install: the VS Code app is not offered (all output: $(LOGS)/code-server.log)"; }
	@touch $@

# ---- the JupyterLab extension (extensions/jupyterlab_gpulab) ----------------------------------
# jlpm (Yarn, shipped with jupyterlab) builds the frontend once; the wheel then carries the built
# assets, so servers need no Node.js. pip reuses the built assets (hatch-jupyter-builder's
# skip-if-exists), so only a change under src/ or style/ triggers a rebuild.
LABEXT := extensions/jupyterlab_gpulab
LABEXT_BUILT := $(LABEXT)/jupyterlab_gpulab/labextension/static/style.js
LABEXT_SRC := $(wildcard $(LABEXT)/src/*.ts $(LABEXT)/style/*) $(LABEXT)/package.json \
	$(LABEXT)/yarn.lock $(LABEXT)/tsconfig.json
LABEXT_PY := $(wildcard $(LABEXT)/jupyterlab_gpulab/*.py) $(LABEXT)/pyproject.toml \
	$(LABEXT)/install.json $(wildcard $(LABEXT)/jupyter-config/*/*.json)
ABS_BIN := $(abspath $(BIN))

$(LABEXT)/node_modules/.installed: $(VENV)/.installed $(LABEXT)/package.json $(LABEXT)/yarn.lock
	$(call quietly,installing the JupyterLab extension's build tools (jlpm),jlpm-install,\
		cd $(LABEXT) && PATH="$(ABS_BIN):$$PATH" jlpm install)
	@touch $@

$(LABEXT_BUILT): $(LABEXT)/node_modules/.installed $(LABEXT_SRC)
	$(call quietly,building the JupyterLab extension (jlpm build:prod),jlpm-build,\
		cd $(LABEXT) && PATH="$(ABS_BIN):$$PATH" jlpm build:prod)

$(VENV)/.labext-installed: $(LABEXT_BUILT) $(LABEXT_PY)
	$(call quietly,installing the JupyterLab extension into $(VENV),pip-labext,\
		$(BIN)/pip install -q --disable-pip-version-check hatchling 'hatch-jupyter-builder>=0.5' && \
		$(BIN)/pip install -q --disable-pip-version-check --no-build-isolation ./$(LABEXT))
	@touch $@

labext-test: $(LABEXT)/node_modules/.installed
	cd $(LABEXT) && PATH="$(ABS_BIN):$$PATH" jlpm jest

# `gpulab up` makes the Stable Diffusion tile's demo model in its own data dir (--data-dir) and
# prints how to log in last, once the hub runs.
run: install
	@$(BIN)/gpulab up $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The suite runs in parallel (pytest-xdist): its tests mostly wait on servers, so more workers
# than cores pay off. Tests that share a module's fixtures, or must not run side by side (the
# test swarm, grading), stay on one worker (--dist loadgroup, see tests/conftest.py).
# ARGS='-n0 ...' runs serially (e.g. one test file); TEST_WORKERS=N changes the count. The 20
# slowest tests are printed at the end, so a run's log says where the time goes.
TEST_WORKERS ?= 4

test: install lint labext-test
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20 $(ARGS)

bench: install
	$(BIN)/python benchmarks/spawn.py $(ARGS)

bench-apps: install
	$(BIN)/python benchmarks/app_launch.py $(ARGS)

# "Class starts": 40 students' servers for a booked lab session vs 40 stock JupyterHub spawns.
bench-class: install
	$(BIN)/python benchmarks/class_start.py $(ARGS)

# `ssh NAME@hub true` round trips and 1 GB SFTP through gpulab's gateway vs OpenSSH's sshd (root).
bench-ssh: install
	$(BIN)/python benchmarks/ssh.py $(ARGS)

# gpulab-swarm vs gpulab-docker on a two-node test swarm on this machine (as root).
bench-swarm: install
	$(BIN)/python benchmarks/swarm_spawn.py $(ARGS)

# What operators' metrics cost: a /hub/metrics scrape with 1,000 users and 200 allocations (against
# JupyterHub's own scrape), the observer and card sampler per 100 servers (root: cgroups).
bench-metrics: install
	$(BIN)/python benchmarks/metrics.py $(ARGS)

# Training jobs: submit-to-running (job vs a named server vs a bare process) and the resume
# after a spot preemption against the reference's 4 minutes (root; --swarm adds 2x2-card gangs).
bench-jobs: install
	$(BIN)/python benchmarks/jobs.py $(ARGS)

clean:
	rm -rf $(VENV) node_modules .gpulab .pytest_cache .ruff_cache
	rm -rf $(LABEXT)/node_modules $(LABEXT)/lib $(LABEXT)/tsconfig.tsbuildinfo $(LABEXT)/jupyterlab_gpulab/labextension
