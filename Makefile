# bayes-zoo: `make demo` and `make test` are the only commands a new machine needs.
# Each creates .venv on first use with the first Python >= 3.12 it finds.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTHON_CANDIDATES := python3.12 python3.13 python3.14 python3 python
# The persistent JAX compilation cache makes the second compile of a kernel ~5x cheaper.
export BAYES_ZOO_JAX_CACHE ?= $(CURDIR)/.jax_cache
# make test: pytest-xdist worker processes. Tracing and XLA compilation, most of the suite, run on one core each.
TEST_WORKERS ?= 2

.PHONY: demo test test-all bench notebooks docs references lint venv clean help

help:
	@echo "make demo        fit every model with every method, write the HTML report (zoo demo)"
	@echo "make test        the CI suite (fast tests + notebooks in FAST mode) in TEST_WORKERS=2 processes"
	@echo "make test-all    everything, including @pytest.mark.slow statistical runs and Ray"
	@echo "make bench       run benchmarks/ and write benchmarks/results.md"
	@echo "make notebooks   execute notebooks at full size into notebooks/_build/"
	@echo "make docs        the documentation site into docs/_build/html, warnings as errors; the notebooks are"
	@echo "                 executed during the build in FAST mode, at full size with FULL=1"
	@echo "make references  make the stored reference posteriors (zoo/references/): resumable, keeps healthy"
	@echo "                 current ones, refuses unhealthy ones; MODELS='bpca ssgp_lmm' for some, FORCE=1 to redo"

$(STAMP): pyproject.toml
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  found=""; tried=""; \
	  for c in $(PYTHON_CANDIDATES); do \
	    tried="$$tried $$c"; \
	    if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then \
	      found=$$c; break; \
	    fi; \
	  done; \
	  if [ -z "$$found" ]; then \
	    echo "error: bayes-zoo needs Python >= 3.12 (ArviZ 1.x requires it); tried:$$tried" >&2; \
	    echo "       install one (e.g. 'pyenv install 3.12') and run make again" >&2; exit 1; \
	  fi; \
	  echo "creating $(VENV) with $$found ($$($$found --version))"; \
	  $$found -m venv $(VENV); \
	fi; \
	$(PY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true; \
	$(PY) -m pip install -q -e '.[dev]'; \
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/zoo demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

test-all: $(STAMP)
	$(PY) -m pip install -q -e '.[dev,distributed]'
	BAYES_ZOO_TEST_XLA_OPT=full $(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks

notebooks: $(STAMP)
	$(PY) -m notebooks.build

docs: $(STAMP)
	FULL=$(if $(filter-out 0,$(FULL)),1,0) $(PY) -m sphinx -W --keep-going -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

references: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(VENV)/bin/zoo references $(MODELS) $(if $(FORCE),--force,)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .jax_cache .pytest_cache notebooks/_build zoo-demo docs/_build docs/_generated docs/notebooks docs/api/generated
