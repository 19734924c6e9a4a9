# Two set-up commands: `make demo` and `make test`. Both create what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build on this kind of machine; on a GPU/ROCm cluster install your torch into $(VENV) first.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test env lab bench soak clean

env: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/workbench demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache test-artifacts
