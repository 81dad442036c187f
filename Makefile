# vmapcheck — the two commands a newcomer needs are `make demo` and `make test`.
# Every target creates .venv on demand from requirements.lock (exact transitive pins).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
UI_PORT ?= 5000
# Stage commands in dvc.yaml call `python`: put the project's interpreter first.
export PATH := $(BIN):$(PATH)
# DVC would otherwise try to send usage analytics over the network.
export DVC_NO_ANALYTICS := 1
export PYTHONUNBUFFERED := 1

.PHONY: help setup demo test test-faults test-multiprocess test-fast test-wheel wheel load lint format ui clean params lock reference \
	verdict browser compare registry rollback promote diagnose exp plots vega-bundle

help:
	@echo "make demo   set up .venv, run the pipeline (dvc repro) and print the verdict"
	@echo "make test   set up .venv and headless Chromium, lint, run unit and end-to-end tests"
	@echo "make test-fast  lint and the unit tests only (no end-to-end pipeline runs)"
	@echo "make test-wheel  build the wheel, install it in a fresh venv, init and run an empty repository"
	@echo "make wheel  build dist/vmapcheck-<version>-py3-none-any.whl"
	@echo "make load [PROCS=8] [SECONDS=600]  PROCS busy processes (scripts/load): a loaded CI machine, to run tests beside"
	@echo "make test-faults  the long fault-injection matrix (SIGKILL each stage, server stopped per MLflow call)"
	@echo "make test-multiprocess  the big multi-process run (4 JAX processes of 2 devices, then check, bench, track)"
	@echo "make ui     MLflow UI over the local store on http://127.0.0.1:$(UI_PORT)"
	@echo "make verdict BASELINE=last-verified|<run id>|<bench_details.json>  benchmark regression verdict"
	@echo "make verdict-paired BASELINE_PROJECT=<dir>  time it and this project ABBA, judge the pairs"
	@echo "make compare [N=10] [FILTER=\"tags.model = 'mlp'\"]  logged runs side by side"
	@echo "make plots  dvc plots show with Vega inlined: the page draws offline; prints its path"
	@echo "make exp    DVC experiments side by side, the columns compared (dvc exp show)"
	@echo "make registry  versions of the registered model, which is @verified, their tags"
	@echo "make rollback  move alias verified back to the previous verified version [MODEL=name]"
	@echo "make promote VERSION=n (or RUN=id)  move alias verified to that version [MODEL=name]"
	@echo "make diagnose  localize a divergence in the current outputs (first stage, layer, leaf)"
	@echo "make params recompose params.yaml from conf/ (as dvc exp run does)"
	@echo "make reference REASON='...'  store the last verified run as the model's reference"
	@echo "make clean  remove generated data, reports, the MLflow store and .venv"

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@py="$$(scripts/find-python)" || { echo "error: .venv installs requirements.lock, whose pins (jax 0.11.2, numpy 2.5.5, ...) need Python >= 3.12, and found none on PATH or under pyenv; install one, or name it with PYTHON=/path/to/python3.12 (vmapcheck itself runs on Python >= 3.11: pip install its wheel beside your JAX, docs/use-in-your-project.md)" >&2; exit 1; }; \
	echo "creating $(VENV) with $$py"; \
	"$$py" -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==26.3
	@# uv installs the rest under the same constraints, from its linked cache: seconds
	@# where pip took about a minute (pip stays in .venv for the user's own installs).
	@# Compiled to bytecode now, as pip does: under PYTHONDONTWRITEBYTECODE (set where CI
	@# runs) every process would otherwise compile each module it imports, every time
	@# (`import mlflow` 2.9 s instead of 1.2 s; the test suite's CPU time up by half).
	$(BIN)/python -m pip install --quiet --constraint requirements.lock uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python --constraint requirements.lock --editable '.[dev,flax,equinox,haiku,keras]'
	@touch $@

demo: $(STAMP)
	@status=0; dvc repro || status=$$?; \
	vmapcheck summary --repro-status $$status || true; \
	exit $$status

# Two pytest-xdist workers, as the project's machines have two cores (three were slower:
# 14 min 40 s against 13 min 41 s, each test slowed by more than the idle time they
# filled). A whole file to a worker: an e2e file's shared pipeline run and every module
# fixture stay in one process. Files go out dearest first (tests/conftest.py), not in
# xdist's default order, so that no worker is left with a long file at the end.
PYTEST_WORKERS := -n 2 --dist loadfile --no-loadscope-reorder

# Everything CI runs: lint, unit and end-to-end tests, the short part of the fault matrix.
# --durations: the log of every run (CI's too) names the 25 dearest tests, where the
# suite's time goes (docs/development.md, "Tests under load").
test: $(STAMP) lint browser
	python -m pytest -m "not faults and not multiprocess" $(PYTEST_WORKERS) --durations=25

# A busy machine on demand (scripts/load: PROCS tight-loop Python processes, stopped on
# Ctrl-C or after SECONDS): run a test command beside it to see how the suite holds under
# load. Not N, which `make compare` already uses.
PROCS ?= 8
load:
	scripts/load $(PROCS) $(SECONDS)

# The long part of the fault-injection matrix (tests/test_faults.py: SIGKILL of every
# stage, the tracking server stopped around every MLflow call of track), 16 cases in
# 3.3 min on two quiet cores, up to 8.5 min under load (2026-12-06, docs/development.md):
# run by the nightly workflow, and before a change to io, store or track.
test-faults: $(STAMP)
	python -m pytest -s -m faults tests/test_faults.py

# The big multi-process run (docs/multiprocess.md): the forward stage as 4 processes of 2
# emulated CPU devices against one of 8, then check, bench and track (one MLflow run).
# CI runs the small one (2 processes of 1 device) in `make test`.
test-multiprocess: $(STAMP)
	python -m pytest -s -m multiprocess tests/test_multiprocess.py

# The unit tests only: no DVC pipeline (e2e) and no stage bodies run in-process
# (stages): the loop while working. The HTML report's unit tests open it in Chromium.
test-fast: $(STAMP) lint browser
	python -m pytest -m "not e2e and not stages" $(PYTEST_WORKERS)

# What a user installs: the wheel, with the stages, the config groups and the templates.
wheel: $(STAMP)
	python -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	@ls dist/vmapcheck-*.whl

# The wheel in a fresh venv, in an empty git repository holding only a model package
# written by the test: vmapcheck init, dvc repro (PASSED), then a planted batching
# mistake fails (tests/e2e/test_own_repository.py; part of `make test` too).
test-wheel: $(STAMP)
	python -m pytest -s tests/e2e/test_own_repository.py

# The HTML report's test opens it in headless Chromium; installed here when missing and
# root (apt-get), else an error names the package. `make demo` does not need it.
browser:
	scripts/ensure-chromium

lint: $(STAMP)
	ruff check .
	ruff format --check .
	mypy

format: $(STAMP)
	ruff check --fix .
	ruff format .

# The reference changes only here, never as a side effect of dvc repro.
reference: $(STAMP)
	@test -n "$(REASON)" || { echo "error: say why the reference changes: make reference REASON='...'" >&2; exit 1; }
	vmapcheck reference make --reason "$(REASON)"

# Judge reports/bench_details.json against a baseline; exits 1 on a regression. The default,
# last-verified, is the newest verified run other than the one that logged these reports
# (reports/track.json); when there is none, it says so and exits 0.
BASELINE ?= last-verified
verdict: $(STAMP)
	vmapcheck verdict --baseline "$(BASELINE)"

# Time a baseline project folder (BASELINE_PROJECT: e.g. `git worktree add ../baseline <rev>`,
# then `dvc repro train` there) and this one in alternating ABBA rounds, and judge the
# paired ratios (docs/benchmark.md, "Paired verdict"); exits 1 on a regression.
.PHONY: verdict-paired
verdict-paired: $(STAMP)
	@test -n "$(BASELINE_PROJECT)" || { echo "error: name the baseline's project folder: make verdict-paired BASELINE_PROJECT=../baseline" >&2; exit 1; }
	vmapcheck verdict-paired --baseline-project "$(BASELINE_PROJECT)"

# The last N runs of every model's experiment, or those an MLflow filter string picks.
N ?= 10
FILTER ?=
# Passed through the environment: the shell never parses the filter's quotes or backticks.
compare: export VMAPCHECK_COMPARE_FILTER = $(FILTER)
compare: $(STAMP)
	vmapcheck compare -n "$(N)" --filter "$$VMAPCHECK_COMPARE_FILTER"

# DVC experiments side by side (docs/pipeline.md): the headline metrics always, and the
# key params that differ between the rows shown. A plain `dvc exp show` lists every
# params.yaml key and every dependency, and DVC has no setting that hides columns by
# default. Both are regexes over column names (metrics by key, params by dotted path).
EXP_METRICS ?= passed|worst_bound_ratio|worst_max_rel_eps|vmap_over_loop@b[0-9]+
EXP_PARAMS ?= model\.name|backend\.name|precision\.name|bench\.name|precision\.tolerance\.rtol
exp: $(STAMP)
	dvc exp show --only-changed --keep '^(Experiment|$(EXP_METRICS))$$' \
		--drop '^(?!(Experiment|$(EXP_METRICS)|$(EXP_PARAMS))$$)'

# The MLflow Model Registry: passing runs register their params; those of the deployment
# target (registry.target) move alias `verified`; `make rollback` moves it back and `make
# promote` to a chosen version. MODEL defaults to registry.registered_model.
registry: $(STAMP)
	vmapcheck registry $(if $(MODEL),--model "$(MODEL)")

rollback: $(STAMP)
	vmapcheck rollback $(if $(MODEL),--model "$(MODEL)")

# `dvc plots show` through .dvc/plots/offline.html: Vega, Vega-Lite and vega-embed inlined
# from the pinned npm builds in src/vmapcheck/project/vega/, so the page draws without a
# network (DVC's own page loads them from a CDN). Prints the page's path and the PNGs'.
plots: $(STAMP)
	vmapcheck plots

# Fetch those builds again (npm pack at the pinned versions), each checked against the
# sha512 and sha256 in src/vmapcheck/project/vega/bundle.json.
vega-bundle:
	scripts/fetch-vega

# Moves `verified` to a version on purpose, e.g. one a run off the deployment target
# (registry.target in conf/config.yaml) registered without the alias.
promote: $(STAMP)
	vmapcheck promote $(if $(MODEL),--model "$(MODEL)") $(if $(VERSION),--version "$(VERSION)") $(if $(RUN),--run "$(RUN)")

# The diagnosis protocol on the current outputs, on demand (check runs it on a failure):
# writes reports/diagnosis-on-demand.json and .txt; exits 1 when it localizes a divergence.
diagnose: $(STAMP)
	vmapcheck diagnose

params: $(STAMP)
	vmapcheck params

# Re-resolve every transitive version from pyproject.toml in a scratch venv. pyproject
# holds ranges: the lock's versions are kept as constraints (a new dependency gets the
# newest in range, a dropped one leaves); FRESH=1 drops them, for the newest of everything
# in range, e.g. after a range moved past a pin.
lock:
	@py="$$(scripts/find-python)" || { echo "error: make lock resolves for make setup, which needs Python >= 3.12 for the lock's pins, and found none; name one with PYTHON=/path/to/python3.12" >&2; exit 1; }; \
	tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; \
	"$$py" -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --quiet $(if $(FRESH),,--constraint requirements.lock) '.[dev,flax,equinox,haiku,keras]' \
	  || { echo "error: pip could not install pyproject.toml's dependencies$(if $(FRESH),, within requirements.lock's versions (a pin outside a range now?): make lock FRESH=1 resolves every version afresh)" >&2; exit 1; }; \
	{ echo "# Every transitive dependency, pinned: make installs with --constraint requirements.lock."; \
	  echo "# Regenerate after changing pyproject.toml: make lock"; \
	  "$$tmp/venv/bin/python" -m pip freeze | grep -v '^vmapcheck'; } > requirements.lock
	@echo "requirements.lock rewritten"

ui: $(STAMP)
	vmapcheck ui --port $(UI_PORT)

# Under reports/, only what git ignores (DVC's outputs): the metrics kept in git stay.
clean:
	rm -rf data/prepared data/cases data/params data/forward mlflow.db mlartifacts \
		.dvc/cache .dvc/tmp .jax_cache $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist
	git clean -fdXq reports 2>/dev/null || rm -rf reports
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
