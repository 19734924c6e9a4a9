# Two set-up commands: `make demo` and `make test`. Both create what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build on this kind of machine; on a GPU/ROCm cluster install your torch into $(VENV) first.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test env lab bench soak clean maxtext-env slurm-pkgs browser-env prometheus-pkg

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
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
		{ echo "make: needs a Python >= 3.11 as PYTHON (now '$(PYTHON)'); set PYTHON=/path/to/python3.11"; exit 1; }
	@test -x $(PY) || $(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || \
		{ echo "make: $(PYTHON) cannot create a virtual environment; on Debian/Ubuntu: apt-get install python3-venv"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]" -r requirements-titan.txt "$(TORCH)"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/workbench demo

test: $(STAMP) maxtext-env slurm-pkgs browser-env prometheus-pkg
	$(PY) -m pytest $(PYTEST_ARGS)

# JupyterLab on the notebooks, loopback only; it prints the URL with its token. No news or update
# pop-ups: an empty news feed and a check-for-updates that never checks (what the browser tests use too).
lab: browser-env
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --no-browser --notebook-dir notebooks $(if $(filter 0,$(shell id -u)),--allow-root) \
		--LabApp.news_url= --LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate

# Benchmarks (not part of `make test`): writes docs/benchmarks.md. `make bench BENCH_ARGS=--quick` for a smoke run.
bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e ".[bench]"
	$(PY) -m bench $(BENCH_ARGS)

soak: $(STAMP)
	$(PY) -m workbench.soak --faults 50

clean:
	rm -rf $(VENV) runs .pytest_cache test-artifacts
