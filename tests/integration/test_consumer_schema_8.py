"""The consumer's writes of this release on a store at schema version 8 (0.1.0's), as the hosts of a 0.1.0
installation run it before `chronos migrate` (docs/operations/upgrading.md): straight in, through the staging
table, replaced and cancelled, without the input partition (version 12) nor a forward noted (13); once
migrated, a store opened anew records the partition."""

from __future__ import annotations

import time

import psycopg

from chronos.adapters.postgres import migrations
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Row


def row(mid: str, value: bytes = b"v") -> Row:
    return Row(mid, time.time_ns() // 1000 + 3_600_000_000, None, b"k", value, b"", None, 3)


def stored(url: str) -> dict[str, tuple]:
    with psycopg.connect(url) as conn:
        return {r[0]: r[1:] for r in conn.execute("SELECT id, value FROM chronos_messages")}


def test_the_consumer_writes_on_schema_8_without_the_input_partition_and_with_it_once_migrated(empty_database_url):
    url = empty_database_url
    migrations.migrate(url, [m for m in migrations.migrations() if m.version <= 8])
    store = Store(url)
    assert store.apply([row("a"), row("b")], [], []) == (2, 0, 0, 0)               # the COPY
    assert store.apply([row("a"), row("c")], [row("b", b"new")], ["x"], forward=True) == (1, 1, 0, 0)  # staged
    assert stored(url) == {"a": (b"v",), "b": (b"new",), "c": (b"v",)}
    assert store.pending_forwards(10) == []
    store.close()
    assert migrations.migrate(url) == list(range(9, migrations.LATEST_VERSION + 1))
    store = Store(url)
    assert store.apply([row("d")], [], ["y"], forward=True) == (1, 0, 0, 0)
    assert [f.id for f in store.pending_forwards(10)] == ["y"]
    with psycopg.connect(url) as conn:
        assert dict(conn.execute("SELECT id, input_partition FROM chronos_messages").fetchall()) == \
            {"a": None, "b": None, "c": None, "d": 3}
    store.close()
