# The two set-up commands of the README:
#   make up    set up and run the whole stack (embedded PostgreSQL and broker unless real ones are configured)
#   make test  set up and pass the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test bench clean chromium

up: $(VENV)/.installed
	$(BIN)/chronos up $(ARGS)

test: $(VENV)/.installed chromium
	$(BIN)/python -m pytest $(ARGS)

# The console's browser tests drive Debian's chromium (Playwright's own browser download is not
# used). Installed here when missing; without it the browser tests fail rather than skip.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "make test: the console's browser tests need Debian's chromium at $(CHROMIUM): sudo apt-get install chromium" >&2; exit 1; fi; }

bench: $(VENV)/.installed
	$(BIN)/python -m pytest benchmarks --benchmark-only $(ARGS)

$(VENV)/.installed: pyproject.toml setup.py native/_native.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info native/*.c chronos/codec/*.so .chronos
