"""`chronos migrate`: create or upgrade the database schema."""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config


def add_parser(sub: Any) -> None:
    p = sub.add_parser("migrate", help="create or upgrade the database schema (idempotent)")
    config.add_arguments(p, only=("database_url", "database_pool_mode", "log_level"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronos.adapters.postgres import migrations, pooling
    settings = config.load(args)
    url = settings.require_database()
    # a pool mode the processes would fail with is found here, before they start
    if pooling.resolve_pool_mode(url, settings.database_pool_mode, check=True) == pooling.TRANSACTION:
        print("PostgreSQL is reached through a pooler in transaction mode: the processes prepare no statement "
              "and make their settings in each transaction")
    applied = migrations.migrate(url)
    if applied:
        print(f"applied migrations {', '.join(map(str, applied))}; schema at version {migrations.LATEST_VERSION}")
    else:
        print(f"schema already at version {migrations.LATEST_VERSION}")
    return 0
