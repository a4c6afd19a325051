"""The pool mode probe's reasoning and the backstop's reading of errors, without PostgreSQL (the real
poolers: tests/integration/test_pooler.py)."""

from __future__ import annotations

import contextlib
import itertools

import psycopg
import pytest

from chronos.adapters.postgres import pooling
from chronos.errors import ConfigError, PoolModeMismatch


class Client:
    """A client connection that answers pg_backend_pid() from a list, and may refuse transactions."""

    def __init__(self, pids, refuse_transactions: bool = False):
        self.pids = iter(pids)
        self.refuse = refuse_transactions
        self.asked = 0

    def pid(self) -> int:
        self.asked += 1
        return next(self.pids)

    @contextlib.contextmanager
    def transaction(self):
        if self.refuse:
            raise psycopg.errors.ProtocolViolation("transaction blocks not allowed in statement pooling mode")
        yield


def probe(a: Client, b: Client) -> str:
    return pooling.probe(a, b, lambda client: client.pid())


def test_two_connections_on_one_backend_are_a_pooler_in_transaction_mode():
    a = Client([7, 7, 7])
    assert probe(a, Client([7])) == pooling.TRANSACTION
    assert a.asked == 1  # B on A's backend settles it: A never waits for a backend B holds


def test_a_connection_that_moves_to_another_backend_is_a_pooler_in_transaction_mode():
    assert probe(Client([7, 7, 9]), Client([8])) == pooling.TRANSACTION       # while B holds its transaction
    assert probe(Client([7, 7, 7, 7, 7, 8]), Client([8])) == pooling.TRANSACTION  # after it


def test_connections_that_keep_their_backends_are_session_mode_or_no_pooler():
    a = Client(itertools.repeat(7))
    assert probe(a, Client([8])) == pooling.SESSION
    assert a.asked == 1 + 2 * pooling.PROBE_ROUNDS


def test_a_pooler_in_statement_mode_is_refused():
    with pytest.raises(ConfigError, match="statement mode, which allows no transaction"):
        probe(Client([7]), Client([8], refuse_transactions=True))


@pytest.mark.parametrize("error, what", [
    (psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist'), "prepared on the"),
    (psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists'), "another client's"),
    (psycopg.errors.UndefinedTable('relation "chronos_staging" does not exist'), "staging table is gone"),
])
def test_what_only_a_pooler_in_transaction_mode_causes_names_the_setting(error, what):
    found = pooling.vanished(error)
    assert found is not None and what in found
    mismatch = pooling.mismatch("db:6432", found)
    assert isinstance(mismatch, PoolModeMismatch) and mismatch.exit_code == 2
    assert str(mismatch).endswith("set CHRONOS_DATABASE_POOL_MODE=transaction") and "\n" not in str(mismatch)


def test_other_errors_are_left_to_the_usual_translation():
    assert pooling.vanished(psycopg.errors.UndefinedTable('relation "chronos_messages" does not exist')) is None
    assert pooling.vanished(psycopg.errors.UniqueViolation("duplicate key")) is None
