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

bench: setup
	python bench/gradient_exchange.py
	python bench/input_pipeline.py
	python bench/checkpoint_cost.py

clean:
	rm -rf runs .pytest_cache
