# layerwise: `make run` sets everything up and runs the main job; `make test` runs the tests.
# Both create .venv and install the locked dependency set first (once; again when it changes).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test verify-zoo install lock lint bench clean

run: $(STAMP)
	$(BIN)/layerwise models
	$(BIN)/layerwise graph vgg16 --cluster h200x16
	$(BIN)/layerwise search vgg16 --devices 4 --cluster h200x16 --analytic
	$(BIN)/layerwise run

# Three xdist workers: the suite's tests wait on the processes they start (servers, launchers,
# CLIs) part of the time, which a third worker fills on 2 cores (9:28 -> 8:14 and 10:23 -> 9:36,
# the cores then 0.5% idle; docs/performance.md, the test suite). More cores: TEST_WORKERS=N.
TEST_WORKERS ?= 3

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -p no:cacheprovider

# Every zoo model under `layerwise verify --strategy all` at 2 and 4 processes, one at a time
# (VGG-16's float64 runs need ~20 GB at 4 processes); the suite checks one model per structure.
verify-zoo: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -rP -m zoo tests/test_verify.py

install: $(STAMP)

$(STAMP): pyproject.toml setup.py requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "layerwise needs Python >= 3.11 (found $$($(PYTHON) --version)); set PYTHON=python3.11"; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Re-resolve the pinned ranges in pyproject.toml and write the full lock (run after editing them).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet -e '.[dev]'
	{ echo "# Full resolved dependency set; \`make install\` installs exactly this. Regenerate with \`make lock\`."; \
	  .lock-venv/bin/python -m pip freeze --all --exclude-editable | grep -v -i -E '^(layerwise|pip)==' | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > requirements.lock.tmp
	mv requirements.lock.tmp requirements.lock && rm -rf .lock-venv

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_search.py
	$(BIN)/python benchmarks/bench_runtime.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
