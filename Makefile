# `make demo` and `make test` each do the whole set-up first (idempotent:
# seconds once done), so both work on a fresh machine.
VENV ?= .venv
NP ?= 2
MODEL_DIR ?= runs/demo
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup demo test bench clean

setup:
	HVDTRAIN_VENV=$(VENV) bash scripts/install.sh

# The demo starts afresh each time: it removes its own MODEL_DIR first.
demo: setup
	rm -rf -- "$(MODEL_DIR)"
	hvdtrain check-config horovodrun.cfg
	horovodrun --config-file horovodrun.cfg -np $(NP) -H localhost:$(NP) \
		hvdtrain train --recipe=digits_cnn --model_dir="$(MODEL_DIR)"

test: setup
	python -m pytest tests

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
	-bash bench/keras2_env.sh
	python bench/alternatives.py

clean:
	rm -rf runs .pytest_cache
