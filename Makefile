# Two commands: `make demo` and `make test`. Both create .venv and install into it first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch is installed on its own first so a pinned, locally available build is used (CPU wheel here);
# override with `make TORCH_SPEC="torch" demo` to take whatever your index serves (e.g. a CUDA build).
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.lmprof-installed

.PHONY: setup demo test clean

$(STAMP): pyproject.toml setup.py src/lmprof/trace/_scan.c Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	@# Once per machine: this device's achievable FLOP/s and bandwidth, so MFU has a ceiling on CPUs too.
	$(VENV)/bin/lmprof calibrate --device auto --if-missing
	$(VENV)/bin/lmprof train --out runs

test: setup
	@bash scripts/ensure_chromium.sh || echo "chromium unavailable: the browser test will say why it is skipped"
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy src/lmprof
	$(PY) -m pytest -n 2 tests

clean:
	rm -rf $(VENV) runs sweeps-out .pytest_cache
