"""The PostgreSQL fixtures the tests and the micro benchmarks share (`make bench` collects only
benchmarks/, so they live here, above both).

One embedded PostgreSQL (fsync off) per session with a migrated template database; each test
gets a fresh database cloned from it.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterator

import psycopg
import pytest

from benchmarks.harness.database import database_url_for

TEMPLATE = "chronos_template"


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory):
    """The session's embedded PostgreSQL, with the migrated database `chronos_template`."""
    from chronos.adapters.postgres.migrations import migrate
    from chronos.embedded.postgres import EmbeddedPostgres
    base = tmp_path_factory.mktemp("pg")
    server = EmbeddedPostgres(base / "data", fast=True, log_path=base / "postgres.log")
    server.start()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    migrate(database_url_for(server.url, TEMPLATE))
    yield server
    server.stop()


@contextmanager
def _fresh_database(server_url: str, prefix: str, template: str | None) -> Iterator[str]:
    """A new database on the server (a copy of `template`, or empty), dropped afterwards: its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    yield database_url_for(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def database_url(pg_server) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    with _fresh_database(pg_server.url, "t", TEMPLATE) as url:
        yield url


@pytest.fixture
def empty_database_url(pg_server) -> Iterator[str]:
    """A fresh database with no schema at all."""
    with _fresh_database(pg_server.url, "e", None) as url:
        yield url


@pytest.fixture
def two_cells(pg_server) -> Iterator[dict[str, str]]:
    """Two fresh, migrated databases, as the databases of two cells: cell name -> URL."""
    with _fresh_database(pg_server.url, "ca", TEMPLATE) as a, _fresh_database(pg_server.url, "cb", TEMPLATE) as b:
        yield {"a": a, "b": b}


@pytest.fixture
def two_empty_cells(pg_server) -> Iterator[dict[str, str]]:
    """Two fresh databases with no schema, as the databases of two cells: cell name -> URL."""
    with _fresh_database(pg_server.url, "ea", None) as a, _fresh_database(pg_server.url, "eb", None) as b:
        yield {"a": a, "b": b}
