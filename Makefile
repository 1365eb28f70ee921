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

demo: $(STAMP)
	$(VENV)/bin/train pipeline demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf work runs .pytest_cache .ruff_cache
