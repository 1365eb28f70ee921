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

# one torch thread: CPU sums are ordered by the thread count, so the demo then prints the README's
# table digit for digit on any CPU machine (with 2 threads the last digits differ)
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/train pipeline demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf work runs .pytest_cache .ruff_cache
