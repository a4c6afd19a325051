"""Which sessions wait for the WAL flush: the consumer's must (its Kafka offsets are committed
after its insert), the firer's need not (a lost claim, delete or hand-back only fires a row
again). Checked on the stores the processes themselves build."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from chronos import config
from chronos import processes
from chronos.runtime.process import Lifecycle


def synchronous_commit(store) -> str:
    return store._run(lambda conn: conn.execute("SHOW synchronous_commit").fetchone()[0])


@pytest.fixture
def durable_env(chronos_env):
    """The test server runs with synchronous_commit off for speed; this database gets the
    production default back, so that only what the processes set themselves differs."""
    url = chronos_env["CHRONOS_DATABASE_URL"]
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(psycopg.sql.Identifier(name)))
    return chronos_env


def test_firer_commits_asynchronously_and_the_consumer_synchronously(durable_env):
    # two claimers, so that every claiming connection is seen to be set
    settings = config.load(environ={**durable_env, "CHRONOS_FIRER_CLAIMERS": "2"}, default_ready_file=False)
    firer = processes.build_firer(settings, uuid.uuid4(), Lifecycle())
    consumer = processes.build_consumer(settings, uuid.uuid4(), Lifecycle())
    try:
        assert synchronous_commit(firer.settler.store) == "off"   # deletes, hand-backs, retries
        assert [synchronous_commit(c.store) for c in firer.claimers] == ["off", "off"]  # claims
        assert synchronous_commit(consumer.store) == "on"
        # a reconnection keeps the setting: it is made on every new session
        firer.settler.store.close()
        assert synchronous_commit(firer.settler.store) == "off"
    finally:
        firer.settler.store.close()
        for claimer in firer.claimers:
            claimer.store.close()
        consumer.close()
