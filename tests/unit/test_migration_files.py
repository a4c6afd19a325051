"""The migration files' loader: every file of the package's sql folder by its four-digit version, in order,
and no two of one version."""

from __future__ import annotations

import pytest

from chronos.adapters.postgres import migrations


def test_the_package_has_one_migration_per_version_in_order():
    versions = [m.version for m in migrations.migrations()]
    assert versions == sorted(set(versions)) and versions[-1] == migrations.LATEST_VERSION


def test_the_loader_reads_a_folder_in_version_order(tmp_path):
    (tmp_path / "0002_second.sql").write_text("SELECT 2;")
    (tmp_path / "0001_first.sql").write_text("SELECT 1;")
    (tmp_path / "queries.sql").write_text("-- name: not a migration")
    assert [(m.version, m.name) for m in migrations.migrations(tmp_path)] == [(1, "first"), (2, "second")]


def test_two_migrations_of_one_version_are_refused_with_both_names(tmp_path):
    """Two changes of the schema made side by side, each numbered the next free version: both would ship as
    that version, and a database migrated with one would never get the other."""
    (tmp_path / "0010_cells.sql").write_text("SELECT 1;")
    (tmp_path / "0010_cheaper_claim.sql").write_text("SELECT 2;")
    with pytest.raises(ValueError, match="two migrations of version 10: 0010_cells.sql and 0010_cheaper_claim.sql"):
        migrations.migrations(tmp_path)
