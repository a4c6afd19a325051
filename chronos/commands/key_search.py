"""`chronos key-search [on|off]`: build, drop or show the index of the messages' keys that a search by key reads,
in the database or every cell's."""

from __future__ import annotations

import argparse
from typing import Any

from chronos import config


def add_parser(sub: Any) -> None:
    p = sub.add_parser("key-search", help="build or drop the index that a search by message key reads, or show it",
                       description="With no argument, say whether the database (with cells, each cell's) has the "
                                   "index that `chronos list --key`, the actions' --filter --key and the console's "
                                   "search by key read. `on` builds it without blocking a write (it reads the table "
                                   "once); `off` drops it. Every message with a key "
                                   "writes to it, so it costs PostgreSQL CPU and WAL on every write: a search by key "
                                   "without it still answers, reading the rows in deadline order. A build cut off "
                                   "leaves the index invalid, written to and never read: `on` builds it again, `off` "
                                   "drops it.")
    config.add_arguments(p, only=("database_url", "cells", "database_pool_mode", "log_level"))
    p.add_argument("turn", nargs="?", choices=("on", "off"), help="build (on) or drop (off) the index")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronos.adapters.postgres import key_search, pooling
    settings = config.load(args)
    for cell, url in settings.databases().items():
        prefix = f"cell {cell}: " if cell else ""
        # the build holds chronos migrate's session lock across statements: through a pooler in transaction mode
        # the lock would stay on a server connection the pooler lends to others, and every later migration wait
        if pooling.resolve_pool_mode(url, settings.database_pool_mode, check=True) == pooling.TRANSACTION:
            raise config.ConfigError(f"{prefix}PostgreSQL is reached through a pooler in transaction mode: chronos "
                                     "key-search needs a session of its own; give it PostgreSQL's own address, as "
                                     "chronos migrate's owner URL")
        if args.turn == "on":
            now, changed = key_search.turn_on(url)
            print(f"{prefix}{'built' if changed else 'already on:'} the key-search index {key_search.INDEX} "
                  f"({mb(now.size_bytes)})")
        elif args.turn == "off":
            _, changed = key_search.turn_off(url)
            print(f"{prefix}{'dropped the key-search index' if changed else 'key search already off'}")
        else:
            print(prefix + said(key_search.state(url)))
    return 0


def said(found: Any) -> str:
    """A database's key search, in a line (`found`: chronos.adapters.postgres.key_search.KeySearch)."""
    from chronos.adapters.postgres import key_search
    if found.state == key_search.ON:
        return f"key search on: index {key_search.INDEX} ({mb(found.size_bytes)})"
    if found.state == key_search.INVALID:
        return (f"key search invalid: a build of {key_search.INDEX} did not finish; the index is written to and "
                "never read (chronos key-search on builds it again, off drops it)")
    return "key search off: a search by key reads the rows in deadline order (chronos key-search on builds its index)"


def mb(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB"
