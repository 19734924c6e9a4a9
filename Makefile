# Two set-up commands: `make demo` and `make test`. Both create what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build on this kind of machine. A GPU/ROCm cluster's build: `make env TORCH_INDEX=<its wheel index URL>`
# (or any TORCH=... pip can install), before anything else is installed.
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test check env lab classroom classroom-run bench-classroom bench soak clean maxtext-env slurm-pkgs browser-env prometheus-pkg check-test

# The install steps run apt-get and pip into shared places: never two at once, even under `make -j`.
.NOTPARALLEL:

env: $(STAMP)

# MaxText needs Python >= 3.12 and runs in its own environment, as in its own container.
maxtext-env:
	bash scripts/setup-maxtext.sh

# Debian's chromium and JupyterLab + Playwright for the browser tests (no browser download).
browser-env: $(STAMP)
	PYTHON=$(PY) bash scripts/setup-browser.sh

# Debian's Slurm, MariaDB and munge for the local Slurm cluster the tests bring up.
slurm-pkgs:
	bash scripts/install-slurm.sh

# Debian's Prometheus server, which the metrics test starts to scrape `workbench serve-metrics`.
prometheus-pkg:
	bash scripts/install-prometheus.sh

$(STAMP): pyproject.toml requirements-titan.txt
	@PYTHON="$(PYTHON)" bash scripts/check-setup.sh demo
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]" -r requirements-titan.txt "$(TORCH)"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/workbench demo

# What the machine must have (Python 3.11 with venv, a Python 3.12 for MaxText, apt-get as root),
# checked before anything is installed: one line naming the first thing missing.
check-test:
	@PYTHON="$(PYTHON)" bash scripts/check-setup.sh test

test: check-test $(STAMP) check maxtext-env slurm-pkgs browser-env prometheus-pkg
	$(PY) -m pytest $(PYTEST_ARGS)

# The shape the code must keep, each by its tool (pyproject.toml holds their settings): ruff's lint and
# format, the import contracts (the data flow points one way), mypy on the core packages.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# JupyterLab on the notebooks, loopback only; it prints the URL with its token. No news or update
# pop-ups: browser-env writes fetchNews/checkForUpdates off into the venv's overrides.json, and the
# flags give an empty news feed and a check-for-updates that never checks (tests/browser checks it).
lab: browser-env
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --no-browser --notebook-dir notebooks $(if $(filter 0,$(shell id -u)),--allow-root) \
		--LabApp.news_url= --LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate

# The live dashboard of RUN (default: the newest run) as a page with no code, for a projector:
# `make classroom [RUN=runs/...] [FAULTS=1] [PORT=8866]`; prints the URL with its token.
classroom: browser-env
	$(VENV)/bin/workbench classroom $(RUN) $(if $(FAULTS),--faults) $(if $(PORT),--port $(PORT))

# Submit configs/classroom.yaml (16 groups, chaos: a fault every 29 s for 30 min, DiLoCo) and serve its
# dashboard: `make classroom-run [CLASSROOM_ARGS="replicas=24 chaos.max_faults=10"] [FAULTS=1] [PORT=8866]`.
classroom-run: browser-env
	$(VENV)/bin/workbench classroom --config configs/classroom.yaml $(foreach o,$(CLASSROOM_ARGS),--set $(o)) \
		$(if $(FAULTS),--faults) $(if $(PORT),--port $(PORT))

# The classroom run under chaos and fault-free, back to back: throughput retained, faults, final loss, the
# dashboard's update time at 32 groups. `make bench-classroom CLASSROOM_BENCH="--minutes 30"`, or interleaved
# shorter pairs and the median of their ratios: CLASSROOM_BENCH="--pairs 4 --minutes 5".
bench-classroom: $(STAMP)
	$(PY) -m bench.classroom $(CLASSROOM_BENCH)

# Benchmarks (not part of `make test`): writes docs/benchmarks.md. `make bench BENCH_ARGS=--quick` for a smoke run.
# MaxText, the dev Slurm cluster and chromium are measured too: their installs come first, as for `make test`.
bench: check-test $(STAMP) maxtext-env slurm-pkgs browser-env
	$(PY) -m pip install -q --disable-pip-version-check -e ".[bench]"
	$(PY) -m bench $(BENCH_ARGS)

soak: $(STAMP)
	$(PY) -m workbench.experiments.soak --faults 50

clean:
	rm -rf $(VENV) runs .pytest_cache test-artifacts
