"""A firer of this release on a store at schema version 8 (0.1.0's, before `chronos migrate` adds the firers'
leases): it starts, claims every due row with its first claimer, and divides them once the store is migrated.
This is what lets the hosts of a 0.1.0 installation, which knows no compatibility window, be upgraded one by
one before the migration (docs/operations/upgrading.md)."""

from __future__ import annotations

import time

import psycopg

from chronos.adapters.postgres import migrations
from tests.helpers import two_claimers


def test_a_firer_runs_on_schema_8_claiming_every_row_and_divides_them_once_migrated(empty_database_url):
    url = empty_database_url
    assert migrations.migrate(url, [m for m in migrations.migrations() if m.version <= 8])[-1] == 8
    with psycopg.connect(url) as conn:
        migrations.check_schema(conn)  # this release starts on 0.1.0's schema
    with two_claimers(url) as (first, second, outbox):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO chronos_messages (id, deadline) "
                         "SELECT 'm' || g, now() - interval '10 milliseconds' FROM generate_series(1, 100) g")
            second.claim(time.time())  # before the first knows there are no leases: nothing of its own yet
            first.claim(time.time())   # the lease refused (no such table): every due row, by the first claimer
            _, rows = outbox.get_nowait()
            assert {r.id for r in rows} == {f"m{g}" for g in range(1, 101)}
            assert first.shares is not None and not first.shares.leases
            conn.execute("INSERT INTO chronos_messages (id, deadline) "
                         "SELECT 'n' || g, now() - interval '10 milliseconds' FROM generate_series(1, 100) g")
            second.claim(time.time())  # the second claims nothing while there are no slices to divide
            assert outbox.empty()
            first.claim(time.time())
            _, rows = outbox.get_nowait()
            assert len(rows) == 100
            first.leave()  # nothing to give up, and no error on a schema without leases

            assert migrations.migrate(url) == list(range(9, migrations.LATEST_VERSION + 1))
            first.shares.next_renewal = time.monotonic()  # it looks for the leases again (every 30 s)
            first.claim(time.time())
            assert first.shares.leases
            assert conn.execute("SELECT count(*) FROM chronos_firers WHERE node = %s",
                                (first.store.node_id,)).fetchone()[0] == 1
