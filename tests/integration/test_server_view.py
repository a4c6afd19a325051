"""`Store.server_view` against a real PostgreSQL: the server as it sees itself, the servers replicating
from it, and the Chronos processes' sessions on it, as a superuser and as a role that may not see
other roles' sessions."""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from datetime import datetime, timezone

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks.harness.database import database_url_for
from chronos.adapters.postgres.store import Store, application_name
from chronos.domain.model import Sessions


def conninfo_port(url: str) -> str:
    return str(conninfo_to_dict(url)["port"])


def _sessions(stack: ExitStack, url: str, names: list[str], **params: str) -> None:
    for name in names:
        stack.enter_context(psycopg.connect(url, autocommit=True, application_name=name, **params))


def _standby(stack: ExitStack, url: str) -> None:
    """A walsender, as a standby's connection is: a logical replication connection shows in
    pg_stat_replication (state `startup`) without a slot or a second server."""
    stack.enter_context(psycopg.connect(url, autocommit=True, replication="database", application_name="standby-1"))


def test_the_server_its_standbys_and_the_processes_on_it(database_url):
    consumer, firer, detector = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    store = Store(database_url)
    with ExitStack() as stack:
        _sessions(stack, database_url, [application_name("consumer", consumer), application_name("firer", firer),
                                        application_name("firer", firer), application_name("detector", detector),
                                        "chronos", "chronos firer not-a-node-id", "psql"])
        # a process of another database on the same server is another deployment's
        _sessions(stack, database_url_for(database_url, "postgres"), [application_name("firer", uuid.uuid4())])
        _standby(stack, database_url)
        view = store.server_view()
    store.close()

    with psycopg.connect(database_url) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    assert view.server == f"127.0.0.1:{conninfo_port(database_url)}"
    assert view.address == view.server  # over TCP: what the server says is what the URL named
    assert (view.role, view.version) == ("primary", version)
    assert [(s.name, s.client, s.state, s.sync_state) for s in view.standbys] == \
        [("standby-1", "127.0.0.1", "startup", "async")]
    by_node = {p.node: p for p in view.processes}
    assert [(p.role, p.node, p.sessions) for p in view.processes] == sorted(
        [("consumer", str(consumer), 1), ("detector", str(detector), 1), ("firer", str(firer), 2)])
    started = by_node[str(firer)]
    assert started.visible and started.clients == ["127.0.0.1"]
    assert started.oldest_start is not None and started.oldest_start <= view.at <= datetime.now(timezone.utc)


def test_a_role_without_pg_read_all_stats_sees_the_processes_but_not_their_details(database_url):
    role, firer = f"status_{uuid.uuid4().hex[:8]}", uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")  # the schema check reads one
    try:
        with ExitStack() as stack:
            _sessions(stack, database_url, [application_name("firer", firer)] * 2)
            _standby(stack, database_url)
            store = Store(make_conninfo(database_url, user=role))
            stack.callback(store.close)
            view = store.server_view()
        assert [(s.name, s.client, s.state, s.sync_state) for s in view.standbys] == [("standby-1", None, None, None)]
        assert view.processes == [Sessions("firer", str(firer), 2, [], None, False)]
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_over_a_unix_socket_the_server_has_no_address_and_clients_are_local(database_url, pg_server):
    socket_dir = str(pg_server._socket_dir)
    local = make_conninfo(database_url, host=socket_dir)
    node = uuid.uuid4()
    store = Store(local)
    with ExitStack() as stack:
        _sessions(stack, local, [application_name("consumer", node)])
        view = store.server_view()
    store.close()
    assert view.address is None and view.server == f"{socket_dir}:{conninfo_port(database_url)}"
    assert [(p.node, p.clients) for p in view.processes] == [(str(node), ["local"])]
