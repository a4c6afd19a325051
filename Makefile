# The two set-up commands of the README:
#   make up    set up and run the whole stack (embedded PostgreSQL and broker unless real ones are configured)
#   make test  set up and pass the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test bench clean

up: $(VENV)/.installed
	$(BIN)/chronos up $(ARGS)

test: $(VENV)/.installed
	$(BIN)/python -m pytest $(ARGS)

bench: $(VENV)/.installed
	$(BIN)/python -m pytest benchmarks --benchmark-only $(ARGS)

$(VENV)/.installed: pyproject.toml setup.py native/_native.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info native/*.c chronos/codec/*.so .chronos
