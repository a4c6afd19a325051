"""A store asked to run at a lower priority (`chronos cells move`'s) lowers the PostgreSQL process that serves its
session, where that process runs on this host: the database work of a move waits for the processes beside it
as the command itself does. The tests run as root, as `chronos up`'s owner does, which may lower the embedded
server's processes (they run as a user of their own)."""

from __future__ import annotations

import os

from chronos.adapters.postgres.store import Store


def niceness_of_session(store: Store) -> int:
    store.db_clock_us()  # connects
    assert store.conn is not None
    return os.getpriority(os.PRIO_PROCESS, store.conn.info.backend_pid)


def test_a_store_asked_to_run_at_a_lower_priority_lowers_its_server_process_on_this_host(database_url):
    lowered, plain = Store(database_url, nice=10), Store(database_url)
    try:
        assert niceness_of_session(lowered) == 10
        assert niceness_of_session(plain) == 0
    finally:
        lowered.close()
        plain.close()


def test_a_new_connection_of_the_store_is_lowered_too(database_url):
    store = Store(database_url, nice=10)
    try:
        first = niceness_of_session(store)
        store.open()  # as after a lost connection: another server process
        assert first == 10 and niceness_of_session(store) == 10
    finally:
        store.close()
