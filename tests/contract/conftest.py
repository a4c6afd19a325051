"""One database per test, behind either store: the PostgreSQL `Store` on the embedded PostgreSQL
(tests/conftest.py) or the in-memory twin on a `MemoryDatabase` with a manual clock.

A test reaches the database only through the store ports (`Store`, `OperatorsStore`: both stores
implement both), plus `Backend`'s few ways round it (read a row as stored, let time pass for claims
or buckets), each written for both."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import psycopg
import pytest

from chronos import ports
from chronos.adapters.memory import ManualClock, MemoryDatabase, MemoryStore, MemoryTakes
from chronos.adapters.postgres.store import Store
from chronos.adapters.postgres.takes import TakeStatements
from chronos.domain import cron


@dataclass
class Stored:
    """A row as the database holds it."""

    deadline_us: int
    value: bytes | None
    claimed: bool
    attempts: int
    last_error: str | None
    original_deadline_us: int | None
    input_partition: int | None
    seq: int = 0


class Backend:
    """One database; `store()` opens one more handle (connection) on it."""

    name: str

    def store(self, node_id: uuid.UUID | None = None) -> ports.Store:
        raise NotImplementedError

    def intake(self) -> ports.Store:
        """A handle as the consumer's: a write that waits for a row's lock gives up after a lock timeout and is
        tried again (`IntakeStatements.apply`), for up to a minute."""
        raise NotImplementedError

    def takes(self, node_id: uuid.UUID) -> ports.TakeStore:
        """A firer's session for the claim that deletes."""
        raise NotImplementedError

    def end(self, takes: ports.TakeStore) -> None:
        """What PostgreSQL does to a session idle in its transaction for the hold time: ends it."""
        raise NotImplementedError

    def wait_blocked(self, handles: int = 1) -> None:
        """Until `handles` handles wait for a row's lock (the twin's never wait: at once)."""
        raise NotImplementedError

    def now_us(self) -> int:
        """The database's clock."""
        raise NotImplementedError

    def stored(self, mid: str) -> Stored | None:
        raise NotImplementedError

    def ids(self) -> set[str]:
        raise NotImplementedError

    def parked(self) -> list[tuple[Any, ...]]:
        """(message_id, source, topic, deadline_us, key, value, headers, reason) in the order parked."""
        raise NotImplementedError

    def age_claims(self, seconds: float) -> None:
        """Every claim made `seconds` earlier than it was (a firer that held its rows that long)."""
        raise NotImplementedError

    def make_due(self, mid: str) -> None:
        """The row's deadline one second ago (a retry's backoff over)."""
        raise NotImplementedError

    def age_bucket(self, topic: str, seconds: float) -> None:
        """Let `seconds` pass for a fire-rate bucket without waiting: its last refill moved back."""
        raise NotImplementedError

    def age_leases(self, seconds: float) -> None:
        """Every firer's lease renewed `seconds` earlier than it was (firers that stopped renewing)."""
        raise NotImplementedError

    def age_announcements(self, seconds: float) -> None:
        """Every process's word of where it serves /metrics said `seconds` earlier than it was."""
        raise NotImplementedError

    def age_moves(self, seconds: float) -> None:
        """Every move's lease renewed `seconds` earlier than it was (a move whose runner died)."""
        raise NotImplementedError

    def age_reach(self, seconds: float) -> None:
        """Every consumer's word of the cells it reached said `seconds` earlier than it was."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str):
        self.url = url
        self.opened: list[Store] = []

    def store(self, node_id: uuid.UUID | None = None) -> ports.Store:
        st = Store(self.url, node_id=node_id)
        self.opened.append(st)
        return st

    def intake(self) -> ports.Store:
        st = Store(self.url, node_id=uuid.uuid4(), lock_timeout_ms=200, lock_wait_s=60.0)
        self.opened.append(st)
        return st

    def takes(self, node_id: uuid.UUID) -> ports.TakeStore:
        st = TakeStatements(self.url, node_id=node_id, hot_path=True, synchronous_commit=False, held_ms=60_000,
                            application_name=f"chronos firer {node_id}")
        self.opened.append(st)  # type: ignore[arg-type]
        return st

    def end(self, takes: ports.TakeStore) -> None:
        assert isinstance(takes, TakeStatements) and takes.conn is not None
        self._q("SELECT pg_terminate_backend(%s)", takes.conn.info.backend_pid)

    def wait_blocked(self, handles: int = 1) -> None:
        deadline = time.monotonic() + 10
        while self._q("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND datname = current_database()")[0][0] < handles:
            assert time.monotonic() < deadline, "no handle came to wait for a row's lock"
            time.sleep(0.01)

    def _q(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def now_us(self) -> int:
        return self._q("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")[0][0]

    def stored(self, mid: str) -> Stored | None:
        found = self._q("SELECT (extract(epoch FROM deadline) * 1000000)::bigint, value, readied_at IS NOT NULL, "
                        "attempts, last_error, (extract(epoch FROM original_deadline) * 1000000)::bigint, input_partition, "
                        "seq "
                        "FROM chronos_messages WHERE id = %s", mid)
        return Stored(*found[0]) if found else None

    def ids(self) -> set[str]:
        return {r[0] for r in self._q("SELECT id FROM chronos_messages")}

    def parked(self) -> list[tuple[Any, ...]]:
        return self._q("SELECT message_id, source, topic, (extract(epoch FROM deadline) * 1000000)::bigint, key, "
                       "value, headers, reason FROM chronos_parked ORDER BY id")

    def age_claims(self, seconds: float) -> None:
        self._q("UPDATE chronos_messages SET readied_at = readied_at - %s * interval '1 second' "
                "WHERE readied_at IS NOT NULL", seconds)

    def make_due(self, mid: str) -> None:
        self._q("UPDATE chronos_messages SET deadline = now() - interval '1 second' WHERE id = %s", mid)

    def age_bucket(self, topic: str, seconds: float) -> None:
        self._q("UPDATE chronos_rate_limits SET refilled_at = refilled_at - %s * interval '1 second' "
                "WHERE topic = %s", seconds, topic)

    def age_leases(self, seconds: float) -> None:
        self._q("UPDATE chronos_firers SET seen_at = seen_at - %s * interval '1 second'", seconds)

    def age_announcements(self, seconds: float) -> None:
        self._q("UPDATE chronos_processes SET seen_at = seen_at - %s * interval '1 second'", seconds)

    def age_moves(self, seconds: float) -> None:
        self._q("UPDATE chronos_cell_moves SET seen_at = seen_at - %s * interval '1 second'", seconds)

    def age_reach(self, seconds: float) -> None:
        self._q("UPDATE chronos_consumer_reach SET reached_at = reached_at - %s * interval '1 second'", seconds)

    def close(self) -> None:
        for st in self.opened:
            st.close()


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.db = MemoryDatabase(self.clock)

    def store(self, node_id: uuid.UUID | None = None) -> ports.Store:
        return MemoryStore(self.db, node_id=node_id)

    def intake(self) -> ports.Store:
        return MemoryStore(self.db, node_id=uuid.uuid4())

    def takes(self, node_id: uuid.UUID) -> ports.TakeStore:
        return MemoryTakes(self.db, node_id=node_id)

    def end(self, takes: ports.TakeStore) -> None:
        assert isinstance(takes, MemoryTakes)
        takes.end()

    def wait_blocked(self, handles: int = 1) -> None:
        pass

    def now_us(self) -> int:
        return self.clock()

    def stored(self, mid: str) -> Stored | None:
        r = self.db.rows.get(mid)
        if r is None:
            return None
        return Stored(r.deadline_us, r.value, r.readied_us is not None, r.attempts, r.last_error,
                      r.original_deadline_us, r.input_partition, r.seq)

    def ids(self) -> set[str]:
        return set(self.db.rows)

    def parked(self) -> list[tuple[Any, ...]]:
        return [(m.message_id, m.source, m.topic, None if m.deadline is None else cron.to_us(m.deadline), m.key,
                 m.value, m.headers, m.reason) for m in (p.message for p in self.db.parked)]

    def age_claims(self, seconds: float) -> None:
        for r in self.db.rows.values():
            if r.readied_us is not None:
                r.readied_us -= round(seconds * 1_000_000)
                r.ctid = self.db.new_ctid()

    def make_due(self, mid: str) -> None:
        row = self.db.rows[mid]
        row.deadline_us, row.ctid = self.clock() - 1_000_000, self.db.new_ctid()

    def age_bucket(self, topic: str, seconds: float) -> None:
        self.db.buckets[topic].refilled_us -= round(seconds * 1_000_000)

    def age_leases(self, seconds: float) -> None:
        for node in self.db.firers:
            self.db.firers[node] -= round(seconds * 1_000_000)

    def age_announcements(self, seconds: float) -> None:
        self.db.processes = {node: (role, url, at - round(seconds * 1_000_000))
                             for node, (role, url, at) in self.db.processes.items()}

    def age_moves(self, seconds: float) -> None:
        for move in self.db.moves.values():
            move.seen_us -= round(seconds * 1_000_000)

    def age_reach(self, seconds: float) -> None:
        self.db.reach = {key: at - round(seconds * 1_000_000) for key, at in self.db.reach.items()}

    def close(self) -> None:
        pass


@pytest.fixture(params=["postgres", "memory"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """This test's database, behind the PostgreSQL store and behind the in-memory twin."""
    made: Backend
    if request.param == "postgres":
        made = PostgresBackend(request.getfixturevalue("database_url"))
    else:
        made = MemoryBackend()
    yield made
    made.close()


@pytest.fixture
def s(backend: Backend) -> ports.Store:
    """A store handle with a node id of its own (a firer's, say)."""
    return backend.store(uuid.uuid4())
