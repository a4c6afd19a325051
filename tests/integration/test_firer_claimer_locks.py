"""A firer's two claimers on PostgreSQL: one held up behind a lock does not stop the other from claiming its
own slices."""

from __future__ import annotations

import threading
import time

import psycopg

from chronos.domain.shares import claimer_slices
from tests.helpers import two_claimers, wait_for

TIMEOUT = 10.0


def test_a_claimer_held_up_behind_a_lock_does_not_stop_the_other_claiming_its_slices(database_url):
    with two_claimers(database_url) as (first, second, outbox), psycopg.connect(database_url, autocommit=True) as conn:
        node = first.store.node_id
        first.claim(time.time())  # the firer's lease taken; nothing due yet
        conn.execute("INSERT INTO chronos_messages (id, deadline) "
                     "SELECT 'm' || g, now() - interval '10 milliseconds' FROM generate_series(1, 200) g")
        seconds = {r[0] for r in conn.execute(
            "SELECT id FROM chronos_messages WHERE (hashtext(coalesce(ordering_key, id)) & 15) = ANY(%s)",
            (list(claimer_slices(None, 1, 2)),))}
        assert 50 < len(seconds) < 150
        blocker = psycopg.connect(database_url)
        on_its_way = threading.Thread(target=first.claim, args=(time.time(),))
        try:
            # the first claimer's next pass renews the lease, whose row another transaction holds locked
            blocker.execute("SELECT 1 FROM chronos_firers WHERE node = %s FOR UPDATE", (node,))
            first.shares.next_renewal = time.monotonic()  # due now
            on_its_way.start()
            wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                          "AND datname = current_database()").fetchone()[0] == 1,
                     TIMEOUT, "the first claimer to wait on the lock", every=0.01)
            second.claim(time.time())
            _, rows = outbox.get_nowait()
            assert {r.id for r in rows} == seconds  # its own slices, every due row of them
            assert outbox.empty() and on_its_way.is_alive()
        finally:
            blocker.rollback()
            blocker.close()
            on_its_way.join(TIMEOUT)
        assert not on_its_way.is_alive()
        _, rows = outbox.get_nowait()  # once let go, the first claims its own
        assert {r.id for r in rows} == {f"m{g}" for g in range(1, 201)} - seconds
