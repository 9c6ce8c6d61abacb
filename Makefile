# Two commands: `make demo` and `make test`. Both create .venv and install the locked versions into it.
#
# requirements/*.lock are exact, hashed versions (written by `make lock`, read by uv): run.lock is
# what `make demo` needs, dev.lock adds the test, lint and optional-feature tools. torch is not in
# the locks because which build you want depends on your machine: TORCH_SPEC (installed by pip, so
# your pip configuration and indexes apply) picks it. The default is the tested CPU build; for CUDA:
#   make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" demo
PYTHON ?= python3
VENV   ?= .venv
# make cannot name targets with spaces: a VENV holding one became several targets and venvs.
ifneq ($(words $(VENV)),1)
$(error VENV must be one path without spaces (make cannot name targets with them), not '$(VENV)')
endif
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
TORCH_SPEC ?= torch==2.13.0
# Bytecode is written as modules are first imported, not at install time: compiling every module of
# every locked package (--compile-bytecode, pip's default for torch) took 30 of the 44 s of a fresh
# `make setup`, mostly for modules no command imports. Where PYTHONDONTWRITEBYTECODE is set (as on
# this project's CI machines) Python would never write a .pyc, and every process (each test's
# subprocess, each sweep point) would compile pandas, transformers, rich, ... from source again
# (7.6 s against 2.6 s user time to import the stack): make's commands run without it, so the first
# process to import a module writes its .pyc (atomically: concurrent writers replace one another).
unexport PYTHONDONTWRITEBYTECODE
UV_INSTALL := $(UV) pip install --python $(PY) --quiet
# Everything the editable install is built from: a change to any of them re-runs the install.
SOURCES := pyproject.toml setup.py src/lmprof/trace/kineto/_scan.c src/lmprof/trace/kineto/_keys.h src/lmprof/trace/_nest.c

.PHONY: setup setup-run demo test test-latest test-oldest lock fuzz gpu-check clean

# The venv is made without pip where the system's pip can install into it from outside (pip >= 22.3,
# --python): ensurepip took 4.4 s of a 17.6 s set-up, against 0.2 s. uv.lock then brings pip (at the
# version the venv would have had) and uv. A system without such a pip gets the usual venv.
$(VENV)/.uv: requirements/uv.lock
	@$(PYTHON) scripts/venv_path_ok.py '$(VENV)'
	@test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	@if $(PY) -m pip --version >/dev/null 2>&1; then pip="$(PY) -m pip"; \
	elif $(PYTHON) -m pip --python $(PY) --version >/dev/null 2>&1; then pip="$(PYTHON) -m pip --python $(PY)"; \
	else $(PYTHON) -m venv $(VENV) || exit 1; pip="$(PY) -m pip"; fi; \
	echo "$$pip install -r requirements/uv.lock"; \
	$$pip install -q --disable-pip-version-check --require-hashes --no-deps -r requirements/uv.lock
	@touch $@

# A lock ($(1)) and torch, then lmprof, at once: pip unpacking torch (8 s, on one core) is the longest
# part, and the lock (uv), lmprof's editable install (which compiles its C reader) and the
# dependency check fit beside it. torch goes in without its dependencies: they are in the lock, at
# the locked versions (pip resolving them again took 9 of its 19 s). A build that needs more (CUDA's
# nvidia-* wheels) fails the check (uv's: 30 ms, pip's took 1.7 s) and is installed again the full
# way, dependencies and all.
define install
	($(UV_INSTALL) --require-hashes --no-deps -r $(1) && $(UV_INSTALL) --no-deps --no-build-isolation -e .) & bg=$$!; \
	$(PY) -m pip install -q --disable-pip-version-check --no-compile --no-deps $(TORCH_SPEC); torch=$$?; \
	wait $$bg && test $$torch -eq 0
	$(UV) pip check --python $(PY) >/dev/null 2>&1 || $(PY) -m pip install -q --disable-pip-version-check $(TORCH_SPEC)
endef

# run.lock is what `make demo` needs; dev.lock holds all of it and the test, lint and optional-feature
# tools, so `make test` installs it in place of run.lock, not after it.
$(VENV)/.run: $(VENV)/.uv requirements/run.lock $(SOURCES)
	$(call install,requirements/run.lock)
	@touch $@

$(VENV)/.dev: $(VENV)/.uv requirements/dev.lock requirements/run.lock $(SOURCES)
	$(call install,requirements/dev.lock)
	@touch $@ $(VENV)/.run

setup-run: $(VENV)/.run
setup: $(VENV)/.dev

demo: setup-run
	@# Once per machine: this device's achievable FLOP/s and bandwidth, so MFU has a ceiling on CPUs too.
	@# A calibration refused on a busy machine (its own one line says why) does not stop the demo: the
	@# run then uses the CPU's estimated peak and a quick bandwidth check, and says so.
	$(VENV)/bin/lmprof calibrate --device auto --if-missing || echo "make demo: going on without a calibration"
	$(VENV)/bin/lmprof train --out runs

# The checks and the suite, with the tools at the locked versions (so a new mypy or ruff release
# cannot fail a submission that did not change): scripts/check.sh says how they share the 2 cores.
# worksteal: a worker that runs out of tests takes some of the other's, so one long test at the end
# of a worker's share does not leave the second core idle (217 s -> 211 s of the parallel part).
# The stopwatch tests (lmprof's step time vs the script's own, profiler off) run after the rest, alone:
# a second worker on a 2-core machine moves a run's median by more than the 10% they check. That
# stage collects only the files that mark a test stopwatch (collecting every file imports Lightning,
# mlflow, wandb and hypothesis: 12.8 s of a 40 s stage, against 3.7 s).
STOPWATCH_FILES = $(shell grep -l 'mark\.stopwatch' tests/test_*.py)
check = bash scripts/check.sh $(1) "$(2)" "$(3)"

# Chromium (the report's browser test) is looked for, or installed with apt-get on a fresh machine,
# beside the set-up rather than after it: apt-get and pip's unpacking of torch wait on different things.
test:
	@log=$$(mktemp); bash scripts/ensure_chromium.sh >"$$log" 2>&1 & chromium=$$!; \
	$(MAKE) --no-print-directory setup; rc=$$?; \
	wait $$chromium || echo "chromium unavailable: the browser test will say why it is skipped"; \
	cat "$$log"; rm -f "$$log"; exit $$rc
	$(call check,$(VENV),tests,$(or $(STOPWATCH_FILES),tests))

# Maintainers: the newest (test-latest) and oldest (test-oldest) versions pyproject.toml allows, each in
# its own venv, to see drift before users do. docs/dependencies.md records the last green versions.
test-latest:
	bash scripts/test_versions.sh latest

test-oldest:
	bash scripts/test_versions.sh oldest

# Re-resolve the locks from pyproject.toml's ranges (newest allowed versions), then run `make test`.
lock: $(VENV)/.uv
	bash scripts/lock.sh $(UV)

# Fuzz the C trace reader under AddressSanitizer for FUZZ_SECONDS (default 60); see scripts/fuzz.sh.
fuzz: setup
	bash scripts/fuzz.sh

# The one-shot CUDA validation (issue 51, docs/gpu-validation.md), on a GPU machine; no set-up target:
# the GPU image reaches no registry, so scripts/gpu_check.sh sets up from the machine's own Python and
# the wheels of .whl/ (scripts/gpu_wheels.sh). Rehearse on a CPU: make gpu-check GPU_CHECK_ARGS="--device cpu".
gpu-check:
	bash scripts/gpu_check.sh $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .venv-latest .venv-oldest runs sweeps-out .pytest_cache
