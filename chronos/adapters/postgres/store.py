"""The PostgreSQL store: the statements of the consumer, the firer, the detector, `chronos status` and the
operators, each a method, run on the store's own connection (`session.Session`: its deadline, reconnection
and error translation). One class per port, each in its own module over the session: `intake`, `claims`,
`settle`, `detect`, `operators`, `cells`, `moves`; `Store` is all of them. The claims stand on `shares` (the firers'
leases and the claim of a firer's own slices). A firer's session for the claim that deletes is a class apart
(`takes`: its claims delete). The SQL is in `sql/queries.sql` (`queries.QUERIES`), never in Python.
"""

from __future__ import annotations

import uuid

from chronos import ports
from chronos.adapters.postgres.cells import CellMapStatements
from chronos.adapters.postgres.claims import ClaimStatements
from chronos.adapters.postgres.detect import DetectStatements
from chronos.adapters.postgres.intake import IntakeStatements
from chronos.adapters.postgres.moves import MoveStatements
from chronos.adapters.postgres.operators import OperatorsStatements
from chronos.adapters.postgres.settle import SettleStatements
from chronos.adapters.postgres.takes import TakeStatements
from chronos.config import Settings


class Store(IntakeStatements, ClaimStatements, SettleStatements, DetectStatements, OperatorsStatements,
            CellMapStatements, MoveStatements):
    """The scheduler's table of waiting messages on PostgreSQL: `ports.Store` and `ports.OperatorsStore`. One
    per thread, as its connection is (see `Session`)."""


# The longest a consumer's write waits for a row's lock before it is tried again (a firer's claim that deletes
# holds its rows until Kafka acknowledged them, a fraction of a second; one that hangs, up to the hold time): well
# within the statement's deadline, so that a held row is never taken for a PostgreSQL that does not answer.
INTAKE_LOCK_TIMEOUT_MS = 500


def role_store(settings: Settings, node_id: uuid.UUID, role: str, *, synchronous_commit: bool = True,
               url: str | None = None) -> Store:
    """A process's own store (on `url`, a cell's, or CHRONOS_DATABASE_URL): the hot path's planner settings,
    CHRONOS_DATABASE_TIMEOUT_MS as the deadline of every call, an application name that says which process it
    is (`pg_stat_activity`, `chronos status`), and CHRONOS_DATABASE_POOL_MODE (settled at the process's start:
    chronos.runtime.process). The consumer's waits for a row's lock end after INTAKE_LOCK_TIMEOUT_MS (half the
    deadline at most), and its writes are tried again (`IntakeStatements.apply`) for up to the hold time."""
    lock_timeout = None
    if role == "consumer":
        lock_timeout = max(1, min(INTAKE_LOCK_TIMEOUT_MS, settings.database_timeout_ms // 2))
    return Store(url or settings.require_database(), node_id=node_id, hot_path=True, synchronous_commit=synchronous_commit,
                 deadline_s=settings.database_timeout_ms / 1000.0, application_name=application_name(role, node_id),
                 pool_mode=settings.database_pool_mode, lock_timeout_ms=lock_timeout,
                 lock_wait_s=settings.hold_time_ms / 1000.0)


def take_session(settings: Settings, node_id: uuid.UUID) -> TakeStatements:
    """A firer's session for the claim that deletes (CHRONOS_FIRER_CLAIM=delete): as the firer's own stores,
    committing without waiting for the WAL flush (a commit lost in a crash only fires its rows again), and held
    for at most the hold time (`held_session_settings`)."""
    return TakeStatements(settings.require_database(), node_id=node_id, hot_path=True, synchronous_commit=False,
                          deadline_s=settings.database_timeout_ms / 1000.0,
                          application_name=application_name("firer", node_id), pool_mode=settings.database_pool_mode,
                          held_ms=settings.hold_time_ms)


def application_name(role: str, node_id: uuid.UUID) -> str:
    """`chronos <role> <node id>`: how a process's sessions show in pg_stat_activity."""
    return f"chronos {role} {node_id}"


# held to the ports by the type checker: a method the roles or the operators call that this store lacks fails
# `mypy`; and each port's statements in the class of its module
_PORT: type[ports.Store] = Store
_OPERATORS_PORT: type[ports.OperatorsStore] = Store
_INTAKE_PORT: type[ports.IntakeStore] = IntakeStatements
_CLAIM_PORT: type[ports.ClaimStore] = ClaimStatements
_SETTLE_PORT: type[ports.SettleStore] = SettleStatements
_DETECT_PORT: type[ports.DetectStore] = DetectStatements
_OPERATORS_STATEMENTS_PORT: type[ports.OperatorsStore] = OperatorsStatements
_TAKE_PORT: type[ports.TakeStore] = TakeStatements
_CELL_MAP_PORT: type[ports.CellMapStore] = CellMapStatements
_MOVE_PORT: type[ports.MoveStore] = MoveStatements
_MOVE_STORE: type[ports.MoveStore] = Store
