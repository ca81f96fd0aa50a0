# `make demo` and `make test` each do the whole set-up first (idempotent:
# seconds once done), so both work on a fresh machine.
VENV ?= .venv
# The GPU flavour's own environment for `make test-gpu` (kept outside the
# checkout, so that a new clone reuses it and its Horovod build).
GPU_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hvdtrain/venv-gpu
# The newest Python hvdtrain supports (pyproject.toml) and its environment for
# `make demo-newest-python`, kept outside the checkout as GPU_VENV is.
NEWEST_PYTHON := 3.13
NEWEST_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hvdtrain/venv-py$(subst .,,$(NEWEST_PYTHON))
NP ?= 2
MODEL_DIR ?= runs/demo
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup demo demo-newest-python test test-quick setup-gpu test-gpu bench clean

setup:
	HVDTRAIN_VENV=$(VENV) bash scripts/install.sh

# The demo starts afresh each time: it removes its own MODEL_DIR first.
demo: setup
	rm -rf -- "$(MODEL_DIR)"
	hvdtrain check-config horovodrun.cfg
	horovodrun --config-file horovodrun.cfg -np $(NP) -H localhost:$(NP) \
		hvdtrain train --recipe=digits_cnn --model_dir="$(MODEL_DIR)"

# The demo on the newest supported Python: PYTHON, else python3.13 on PATH
# (PYENV_VERSION lets pyenv's shim of it answer when 3.13 is installed but
# not selected), resolved to the interpreter itself for install.sh.
demo-newest-python:
	@python=$${PYTHON:-$$(PYENV_VERSION=$(NEWEST_PYTHON) python$(NEWEST_PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null)}; \
	found=$$("$${python:-python$(NEWEST_PYTHON)}" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	[ "$$found" = $(NEWEST_PYTHON) ] || { echo "demo-newest-python: needs Python $(NEWEST_PYTHON), and $${python:-python$(NEWEST_PYTHON)} is $${found:+Python }$${found:-not found}: put python$(NEWEST_PYTHON) on PATH or set PYTHON=/path/to/python$(NEWEST_PYTHON)" >&2; exit 1; }; \
	PYTHON="$$python" $(MAKE) --no-print-directory demo VENV="$(NEWEST_VENV)"

# pytest-xdist's workers for the suite, one per core of a 2-core machine
# (how they share it: tests/harness/scheduling.py); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

# The linter (its rules: pyproject.toml), then the whole suite (its tiers:
# docs/testing.md), ending with its 20 slowest tests.
test: setup
	ruff check
	python -m pytest tests --ignore=tests/gpu_flavour -n $(TEST_WORKERS) --durations=20

# The edit-test loop, in minutes: the unit and ranked tests not marked slow
# (a recipe trained, tens of seconds), the ranked ones in one launch per controller.
test-quick: setup
	ruff check
	python -m pytest tests/unit tests/ranked --ranked-np=2 -m "not slow" -n $(TEST_WORKERS) --durations=10

# The GPU flavour (Horovod with NCCL, tensorflow[and-cuda]) built as on a GPU
# node, and tested on the CPU: its build, the default recipe under Gloo and
# MPI, the doctor and bench/gpu_check.py at a tiny size.
setup-gpu:
	HVDTRAIN_GPU=1 HVDTRAIN_VENV=$(GPU_VENV) bash scripts/install.sh

test-gpu: setup-gpu
	PATH=$(GPU_VENV)/bin:$$PATH $(GPU_VENV)/bin/python -m pytest tests/gpu_flavour

# bench/alternatives.py also measures Horovod on tf.keras 2, from a virtualenv of
# its own that bench/keras2_env.sh builds (minutes the first time, seconds after):
# if that build fails, the benchmark runs the other contenders and says why.
bench: setup
	python bench/gradient_exchange.py
	python bench/input_pipeline.py
	python bench/allreduce_bandwidth.py
	python bench/np1_overhead.py
	python bench/weak_scaling.py
	python bench/startup.py
	python bench/preemption.py
	python bench/step_options.py
	python bench/steps_per_execution.py
	python bench/sharded_embeddings.py
	python bench/pipeline.py
	-bash bench/keras2_env.sh
	python bench/alternatives.py

clean:
	rm -rf runs .pytest_cache
