"""What production connects to: every test here runs against Debian's PostgreSQL 15 (the version
production databases run; the embedded one is 18 and has no TLS) with TLS on, in place of the embedded
PostgreSQL, and the Kafka tests reach the embedded broker through a TLS proxy (kits/tls.py).

The server requires TLS and a password from every role but its superuser (`hostssl ... scram-sha-256`,
plaintext rejected). `chronos_app` is the least-privilege role production runs the processes as: it owns
nothing and holds only the grants the production checklist lists.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest
from kits.tls import APP_GRANTS, APP_PASSWORD, APP_ROLE, Authority, require_pg15

from benchmarks.harness.database import database_url_for

# the plan tests and the core end-to-end tests run again here, against PostgreSQL 15 (test_postgres_15.py)
HERE = Path(__file__).resolve().parent
for directory in (HERE.parent / "integration", HERE.parent / "e2e"):
    if str(directory) not in sys.path:
        sys.path.append(str(directory))

TEMPLATE = "chronos_template"
HBA = """\
local all all trust
hostssl all postgres 127.0.0.1/32 trust
hostssl all all 127.0.0.1/32 scram-sha-256
hostnossl all all 127.0.0.1/32 reject
"""


@pytest.fixture(scope="session")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    """The certificate authority the servers' certificates come from."""
    return Authority("chronos-test", tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory, authority: Authority):
    """Debian's PostgreSQL 15 with TLS (a certificate for 127.0.0.1 from `authority`), the migrated
    database `chronos_template`, and the role `chronos_app` (overrides the embedded server for the
    tests here)."""
    from chronos.adapters.postgres.migrations import migrate
    from chronos.embedded.postgres import EmbeddedPostgres
    base = tmp_path_factory.mktemp("pg15")
    server = EmbeddedPostgres(base / "data", fast=True, log_path=base / "postgres.log", bin_dir=require_pg15(),
                              tls=authority.issue("postgres"))
    server.start()  # initdb, then again with the rules above in place
    server.stop()
    (server.data_dir / "pg_hba.conf").write_text(HBA)
    server.start()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
        conn.execute(f"CREATE ROLE {APP_ROLE} LOGIN PASSWORD '{APP_PASSWORD}'")
    migrate(database_url_for(server.url, TEMPLATE))
    with psycopg.connect(database_url_for(server.url, TEMPLATE), autocommit=True) as conn:
        for grant in APP_GRANTS:
            conn.execute(grant)
    yield server
    server.stop()

