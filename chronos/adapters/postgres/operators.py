"""What operators ask of the store on PostgreSQL and do to it (`ports.OperatorsStore`: `chronos show`,
`list`, the actions, the console), and the server as it sees itself (`chronos status`, the console). Run on
the store's session (`session.Session`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

import psycopg

from chronos import codec
from chronos.adapters.postgres.connection import one
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session
from chronos.domain import cron
from chronos.domain.model import Announced, ServerView, Sessions, Standby
from chronos.domain.operators import (ACTIONS, HELD_WITHIN_MS, PREVIEW_BYTES, Filters, Listed, Message, ParkedFilters,
                                      ParkedMessage, ParkedRecord, ParkedRef, Position, Schedule, state_of)


def list_params(f: Filters, limit: int, *, after: Position | None = None, not_at: datetime | None = None,
                held_within_ms: int = HELD_WITHIN_MS) -> dict[str, Any]:
    """The parameters of list_by_deadline and list_by_id: every filter (None: none), the position to
    start after, and how far ahead rows held by a firer's claim that deletes are looked for."""
    return {"state": f.state, "held_within_ms": held_within_ms, "due_after": f.due_after, "due_before": f.due_before,
            "not_at": not_at, "topic": f.topic, "output_topic": f.output_topic, "key": f.key, "ordering_key": f.ordering_key,
            "id_prefix": f.id_prefix, "limit": limit,
            "after_deadline": cron.from_us(after[0]) if isinstance(after, tuple) else None,
            "after_seq": after[1] if isinstance(after, tuple) else None,
            "after_id": after if isinstance(after, str) else None}


def parked_params(f: ParkedFilters | None) -> dict[str, Any]:
    """The parameters of the parked messages' filters (parked_filters in queries.sql; None: none)."""
    f = f or ParkedFilters()
    return {"topic": f.topic, "reason": f.reason, "parked_after": f.parked_after, "parked_before": f.parked_before,
            "id_prefix": f.id_prefix}


def _parked(row: tuple[Any, ...]) -> ParkedMessage:
    n, mid, src, topic, deadline, key, size, preview, headers, reason, at = row
    return ParkedMessage(number=n, message_id=mid, source=src, topic=topic, deadline=deadline, key=key,
                         headers=codec.decode_headers(headers) if headers else [], value_size=size,
                         value_preview=b"" if preview is None else bytes(preview), reason=reason, parked_at=at)


class OperatorsStatements(Session):
    """The operators' side of the store."""

    def show(self, message_id: str, *, output_topic: str) -> Message | None:
        row = self._run(lambda c: c.execute(QUERIES["show_message"], {"id": message_id, "preview": PREVIEW_BYTES})
                        .fetchone())
        if row is None:
            return None
        (mid, deadline, readied_at, readied_by, topic, key, size, preview, headers, okey, enqueued_at, expr, tz,
         dst, attempts, last_error, original_deadline, held) = row
        return Message(id=mid, state=state_of(expr, held), deadline=deadline,
                       topic=topic or output_topic, key=key, headers=codec.decode_headers(headers) if headers else [],
                       value_size=size, value_preview=b"" if preview is None else bytes(preview),
                       ordering_key=okey, enqueued_at=enqueued_at, firer=readied_by, claimed_at=readied_at,
                       cron=expr, timezone=(tz or "UTC") if expr is not None else None, dst_policy=dst,
                       attempts=attempts, last_error=last_error, original_deadline=original_deadline)

    def list_messages(self, f: Filters, *, output_topic: str, limit: int, after: Position | None = None,
                      not_at: datetime | None = None, held_within_ms: int = HELD_WITHIN_MS) -> list[Listed]:
        params = list_params(f, limit, after=after, not_at=not_at, held_within_ms=held_within_ms)
        # prepare=False: planned for these values every time (see list_by_deadline)
        rows = self._run(lambda c: c.execute(QUERIES["list_by_deadline" if f.id_prefix is None else "list_by_id"],
                                             params, prepare=False).fetchall())
        return [Listed(state=s, id=i, deadline=d, seq=q, topic=t or output_topic, key=k, ordering_key=o, firer=r,
                       cron=cr) for s, i, d, q, t, k, o, r, cr in rows]

    def key_search(self) -> bool:
        row = self._run(lambda c: c.execute(QUERIES["key_search_index"]).fetchone())
        return row is not None and bool(row[0])

    def list_parked(self, *, limit: int, before: int | None = None,
                    filters: ParkedFilters | None = None) -> list[ParkedMessage]:
        params = {"before": before, "limit": limit, "preview": PREVIEW_BYTES, **parked_params(filters)}
        return [_parked(r) for r in self._run(lambda c: c.execute(QUERIES["list_parked"], params).fetchall())]

    def show_parked(self, number: int) -> ParkedMessage | None:
        row = self._run(lambda c: c.execute(QUERIES["show_parked"], {"number": number, "preview": PREVIEW_BYTES})
                        .fetchone())
        return None if row is None else _parked(row)

    def find_parked(self, numbers: Sequence[int]) -> list[ParkedRef]:
        rows = self._run(lambda c: c.execute(QUERIES["find_parked"], {"numbers": list(numbers)}).fetchall())
        return [ParkedRef(*r) for r in rows]

    def walk_parked(self, filters: ParkedFilters, *, limit: int, after: int | None = None) -> list[ParkedRef]:
        params = {"after": after, "limit": limit, **parked_params(filters)}
        return [ParkedRef(*r) for r in self._run(lambda c: c.execute(QUERIES["walk_parked"], params).fetchall())]

    def load_parked(self, numbers: Sequence[int]) -> list[ParkedRecord]:
        rows = self._run(lambda c: c.execute(QUERIES["load_parked"], {"numbers": list(numbers)}).fetchall())
        return [ParkedRecord(n, mid, topic, key, value, headers) for n, mid, topic, key, value, headers in rows]

    def settle_replayed(self, replayed: Sequence[int], refused: Sequence[tuple[int, str]], *, counted: bool) -> int:
        def run(conn: psycopg.Connection) -> int:
            with conn.transaction():
                deleted = conn.execute(QUERIES["delete_parked"], {"numbers": list(replayed)}).rowcount if replayed else 0
                if refused:
                    conn.execute(QUERIES["refused_parked"], {"numbers": [n for n, _ in refused],
                                                            "reasons": [r for _, r in refused]})
                conn.execute(QUERIES["count_action"], {"action": "replay_parked", "actions": 1 if counted else 0,
                                                       "messages": deleted})
                return deleted
        return self._run(run)

    def drop_parked(self, numbers: Sequence[int], *, counted: bool) -> list[int]:
        def run(conn: psycopg.Connection) -> list[int]:
            with conn.transaction():
                dropped = [r[0] for r in conn.execute(QUERIES["delete_parked"], {"numbers": list(numbers)})] \
                    if numbers else []
                conn.execute(QUERIES["count_action"], {"action": "drop_parked", "actions": 1 if counted else 0,
                                                       "messages": len(dropped)})
                return dropped
        return self._run(run)

    def list_schedules(self) -> list[Schedule]:
        return self._run(lambda c: [Schedule(*r) for r in self._execute(c, QUERIES["list_schedules"])])

    def present(self, ids: Sequence[str]) -> dict[str, bool]:
        return dict(self._run(lambda c: c.execute(QUERIES["present_ids"], {"ids": list(ids)}).fetchall()))

    def apply_action(self, action: str, ids: Sequence[str], at: datetime | None, *, counted: bool) -> list[str]:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")

        def run(conn: psycopg.Connection) -> list[str]:
            with conn.transaction():
                changed: list[str] = []
                if ids:
                    changed = [r[0] for r in conn.execute(QUERIES[f"act_{action}"], {"ids": list(ids), "at": at})]
                conn.execute(QUERIES["count_action"], {"action": action, "actions": 1 if counted else 0,
                                                       "messages": len(changed)})
                return changed
        return self._run(run)

    def action_totals(self) -> dict[str, tuple[int, int]]:
        return {a: (n, m) for a, n, m in self._run(lambda c: c.execute(QUERIES["action_totals"]).fetchall())}

    def announced(self, within_ms: int) -> list[Announced]:
        def run(conn: psycopg.Connection) -> list[Announced]:
            if one(conn.execute(QUERIES["has_processes"]))[0] is None:
                return []  # a schema before version 10: the processes say nothing there yet
            return [Announced(role, str(node), url, seen)
                    for role, node, url, seen in conn.execute(QUERIES["announced_processes"], {"within_ms": within_ms})]
        return self._run(run)

    def server_view(self) -> ServerView:
        """The server this store is connected to, as it sees itself (address, standby or primary,
        version), the servers replicating from it, and the Chronos processes with sessions on it (by
        their application name, `application_name`). For `chronos status` and the console; in no port:
        the in-memory twin has no server."""
        def run(conn: psycopg.Connection) -> ServerView:
            at, host, port, in_recovery, version = one(conn.execute(QUERIES["server_self"]))
            standbys = [Standby(*r) for r in conn.execute(QUERIES["server_standbys"])]
            processes = [Sessions(role, node, count, list(clients), start, visible)
                         for role, node, count, clients, start, visible in conn.execute(QUERIES["chronos_sessions"])]
            address = None if host is None else f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            return ServerView(at, self.link.server, address, in_recovery, version, standbys, processes)
        return self._run(run)
