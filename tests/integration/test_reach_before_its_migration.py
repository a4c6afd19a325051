"""A consumer's word of the cells it reaches on a cell whose schema predates chronos_consumer_reach (the hosts
upgraded before `chronos migrate` runs): nothing is said nor read, and both work once the cell is migrated,
without a new connection."""

from __future__ import annotations

import uuid

from chronos.adapters.postgres import migrations
from chronos.adapters.postgres.store import Store


def test_before_its_migration_nothing_is_said_and_after_it_the_word_goes_through(empty_database_url):
    url = empty_database_url
    reach = next(m for m in migrations.migrations() if m.name == "consumer_reach")
    migrations.migrate(url, [m for m in migrations.migrations() if m.version < reach.version])
    one, two = Store(url, node_id=uuid.uuid4()), Store(url, node_id=uuid.uuid4())
    try:
        assert one.note_reach("chronos", {"a": 0}) is None
        assert migrations.migrate(url) == [reach.version, *(m.version for m in migrations.migrations()
                                                           if m.version > reach.version)]
        assert one.note_reach("chronos", {"a": 0}) == {}
        assert list(two.note_reach("chronos", {"a": 0})) == ["a"]
    finally:
        one.close()
        two.close()
