# Set-up and everyday commands. Each target creates .venv (Python >= 3.12) if missing.
VENV := .venv
BIN := $(VENV)/bin
# first interpreter found that is Python >= 3.12 (pyenv honours .python-version here)
PYTHON ?= $(shell for p in python3 python3.12 python3.13 python; do \
	if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; \
	then echo $$p; break; fi; done)

.PHONY: help demo arch examples test test-all lint docs bench clean

# time budget of `make test-all`, in seconds: pytest is stopped (exit status 124) past it
TEST_ALL_BUDGET ?= 3600
# pytest processes of `make test` (pytest-xdist; each test module stays in one process, where its
# module fixtures live): the suite is mostly compilation, single-threaded, so one per core
TEST_WORKERS ?= 2
# coreutils timeout (gtimeout on macOS with Homebrew coreutils)
TIMEOUT := $(shell command -v timeout 2>/dev/null || command -v gtimeout 2>/dev/null)

# where `make demo` and `make arch` write their figures and tables
OUT ?= .

help:
	@echo "make demo      install and run the demo: our steps against PyMC's exact steps on 10^6 simulated rows (OUT=$(OUT))"
	@echo "make arch      the paper's ARCH order selection on S&P 500 returns, quick mode (OUT=$(OUT))"
	@echo "make examples  rerun every example into docs/examples (the documentation's figures; long)"
	@echo "make test      install with the test, docs and big extras; run lint, the test suite (TEST_WORKERS=$(TEST_WORKERS) processes), the docs build"
	@echo "make test-all  also run the slow statistical tests (pytest stopped after TEST_ALL_BUDGET=$(TEST_ALL_BUDGET) s)"
	@echo "make docs      build the documentation into docs/_build/html"
	@echo "make bench     run every benchmark script (long)"

$(BIN)/python:
	@if [ -z "$(PYTHON)" ]; then \
		echo "error: no Python >= 3.12 found. Install one (e.g. 'pyenv install 3.12') or run 'make PYTHON=/path/to/python3.12 ...'"; \
		exit 1; fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.stamp-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$*]"
	@touch $@

demo: $(VENV)/.stamp-examples
	$(BIN)/python examples/demo.py --out $(OUT)

arch: $(VENV)/.stamp-examples
	$(BIN)/python examples/arch_selection.py --quick --out $(OUT)

# the documentation's example outputs (docs/examples); see docs/examples.md
examples: $(VENV)/.stamp-examples
	for f in compare_exact logistic_large_n pliable_clutter author_coreference arch_selection; do \
		$(BIN)/python examples/$$f.py --out docs/examples || exit 1; done
	$(BIN)/python examples/arch_selection.py --simulate --out docs/examples

lint: $(VENV)/.stamp-test,docs,big
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs built without warnings: docs/_build/html/index.html"

test-all: lint
	@if [ -z "$(TIMEOUT)" ]; then echo "warning: no timeout command found; running without the time budget"; fi
	$(if $(TIMEOUT),$(TIMEOUT) $(TEST_ALL_BUDGET) )$(BIN)/python -m pytest --durations=10

docs: $(VENV)/.stamp-test,docs,big
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html

bench: $(VENV)/.stamp-examples
	for f in benchmarks/[!_]*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) docs/_build .pytest_cache .ruff_cache .hypothesis
