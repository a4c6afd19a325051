"""Fixtures of the micro benchmarks: an embedded PostgreSQL (fsync off) with the Chronos schema.

Kept apart from tests/conftest.py on purpose: `make bench` collects only this folder.
"""

from __future__ import annotations

import psycopg
import pytest

SPEEDUPS: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="session")
def pg_url(tmp_path_factory: pytest.TempPathFactory):
    from chronos.embedded.postgres import EmbeddedPostgres
    from chronos.adapters.postgres.store import migrate
    base = tmp_path_factory.mktemp("bench-pg")
    server = EmbeddedPostgres(base / "data", fast=True, log_path=base / "postgres.log")
    server.start()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE chronos_bench")
    url = server.url.rsplit("/", 1)[0] + "/chronos_bench"
    migrate(url)
    yield url
    server.stop()


def pytest_terminal_summary(terminalreporter) -> None:
    """The native codec's speed-up over the pure-Python one, per operation (medians; measured, never asserted)."""
    lines = []
    for op, means in sorted(SPEEDUPS.items()):
        if "native" in means and "python" in means:
            lines.append(f"  {op:<16} native {means['native'] * 1e6:9.2f} us   python {means['python'] * 1e6:9.2f} us"
                         f"   speed-up {means['python'] / means['native']:5.1f}x")
    if lines:
        terminalreporter.write_sep("-", "header codec: native vs pure Python (target: at least 5x)")
        for line in lines:
            terminalreporter.write_line(line)
