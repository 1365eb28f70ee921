# Two entry points (see README): `make demo` and `make test`. Both create the virtual environment
# in .venv on first use (torch/torchvision from the registry: a few minutes, about 5.5 GB).
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# one torch thread: CPU sums are ordered by the thread count and by the kernels of the CPU's instruction
# set, so the demo prints the README's table digit for digit with one thread on a CPU running the
# development machine's kernels; elsewhere within a few points of rsum (docs/reproducibility.md)
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/train pipeline demo

# the suite in one worker process per logical CPU, at most 4 (pytest-xdist); a test file stays in one worker, so
# its module fixtures are built once; tests/conftest.py gives each worker its share of the torch threads
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -n logical --maxprocesses 4 --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf work runs .pytest_cache .ruff_cache
