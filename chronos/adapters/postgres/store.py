"""The PostgreSQL store: the statements of the consumer, the firer, the detector, `chronos status` and the
operators, each a method, run on the store's own connection (`session.Session`: its deadline, reconnection
and error translation). The SQL is in `sql/queries.sql` (`queries.QUERIES`), never here.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg

from chronos import codec, ports
from chronos.adapters.postgres.connection import one
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.shares import FirerShares
from chronos.config import Settings
from chronos.domain import cron, ratelimit, schedules
from chronos.domain.model import (DUE_CAP, ESTIMATE_ABOVE, Claimed, NodeLoad, Overview, Parked, Row, ServerView,
                                  Sessions, Stale, Standby, Throttled)
from chronos.domain.operators import (ACTIONS, PREVIEW_BYTES, Filters, Listed, Message, ParkedMessage, Position,
                                      Schedule, state_of)

log = logging.getLogger("chronos.store")


def text_array(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of text values, for a `%s::text[]` parameter: on the firer's hot path,
    far cheaper than psycopg's list adapter (docs/benchmarks/history.md, the array literals' row), and
    cheaper still when no value holds a quote or a backslash (the firer's ids and ctids, nearly always):
    joined and checked once, not escaped one by one."""
    values = list(values)
    if not values:
        return "{}"
    together = "".join(values)
    if '"' not in together and "\\" not in together:
        return '{"' + '","'.join(values) + '"}'
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def _claimed_params(rows: Sequence[Claimed], node: Any) -> dict[str, Any]:
    """(ctid, id, readied_at) triples as array literals. One claim stamps all its rows with one
    readied_at, so each distinct timestamp is formatted once."""
    stamps: dict[Any, str] = {}
    for r in rows:
        if r.readied_at not in stamps:
            stamps[r.readied_at] = r.readied_at.isoformat()
    return {"ctids": text_array(r.ctid for r in rows), "ids": text_array(r.id for r in rows),
            "readied_at": "{" + ",".join(stamps[r.readied_at] for r in rows) + "}", "node": node}


def list_params(f: Filters, limit: int, *, after: Position | None = None,
                not_at: datetime | None = None) -> dict[str, Any]:
    """The parameters of list_by_deadline and list_by_id: every filter (None: none) and the position to
    start after."""
    return {"state": f.state, "due_after": f.due_after, "due_before": f.due_before, "not_at": not_at,
            "topic": f.topic, "output_topic": f.output_topic, "key": f.key, "ordering_key": f.ordering_key,
            "id_prefix": f.id_prefix, "limit": limit,
            "after_deadline": cron.from_us(after[0]) if isinstance(after, tuple) else None,
            "after_seq": after[1] if isinstance(after, tuple) else None,
            "after_id": after if isinstance(after, str) else None}


class Store(FirerShares):
    """The scheduler's table of waiting messages on PostgreSQL: `ports.Store` and `ports.Operators`. One per
    thread, as its connection is (see `Session`); the firers' shares are `FirerShares`."""

    # -- consumer --------------------------------------------------------------------------

    def insert(self, rows: Sequence[Row]) -> int:
        """Insert rows whose id is not waiting yet; returns how many were new."""
        return self.apply(rows, (), ())[0]

    def apply(self, inserts: Sequence[Row], replaces: Sequence[Row],
              cancels: Sequence[str]) -> tuple[int, int, int, int]:
        """One consumer batch in one transaction: COPY the inserts straight into the table (if an id
        is waiting already, the batch is written again with the inserts staged like the replaces,
        and only new ids inserted), COPY the replaces into the session's staging table and
        insert-or-replace from it, and cancel. Returns (inserted, replaced, cancelled,
        cancelled in flight): a cancelled row that a firer had already claimed is deleted all the
        same (nothing hands it back), but that firer may still publish it."""
        if not (inserts or replaces or cancels):
            return 0, 0, 0, 0

        def run(conn: psycopg.Connection) -> tuple[int, int, int, int]:
            if inserts:
                try:
                    return write(conn, direct=True)
                except psycopg.errors.UniqueViolation:
                    pass  # an id of the batch is waiting already: insert only the others, below
            return write(conn, direct=False)

        def write(conn: psycopg.Connection, direct: bool) -> tuple[int, int, int, int]:
            staged = (("u", replaces),) if direct else (("i", inserts), ("u", replaces))
            staging = bool(replaces) or not direct
            if staging and not self._staging_ready and not self.pooled:
                conn.execute(QUERIES["create_staging"])
                self._staging_ready = True
            inserted = replaced = cancelled = in_flight = 0
            # a batch of new ids only (the COPY, which has no plan) needs no settings
            with self._transaction(conn, settings=staging or bool(cancels), staging=staging):
                with conn.cursor() as cur:
                    if direct:
                        # the whole binary COPY stream built natively, handed over in one write: psycopg's
                        # write_row cost more per row than the rest of the consumer's batch path
                        with cur.copy(QUERIES["copy_messages"]) as copy:
                            copy.write(codec.copy_rows(inserts))
                        inserted = len(inserts)
                    if replaces or not direct:
                        with cur.copy(QUERIES["copy_staging_full"]) as copy:
                            copy.set_types(["text", "int8", "text", "bytea", "bytea", "bytea", "text", "text",
                                            "text", "text", "text"])
                            for op, rows in staged:
                                for r in rows:
                                    copy.write_row((r.id, r.deadline_us, r.topic, r.key, r.value, r.headers,
                                                    r.ordering_key, r.cron, r.timezone, op, r.dst_policy))
                    if inserts and not direct:
                        cur.execute(QUERIES["insert_from_staging"])
                        inserted = cur.rowcount
                    if replaces:
                        cur.execute(QUERIES["upsert_from_staging"])
                        replaced = cur.rowcount
                    if cancels:
                        claimed = [r[0] for r in cur.execute(QUERIES["cancel"], {"ids": list(cancels)})]
                        in_flight = sum(claimed)
                        cancelled = len(claimed) - in_flight
            return inserted, replaced, cancelled, in_flight
        return self._run(run)

    def waiting_ids(self, ids: Iterable[str]) -> set[str]:
        ids = list(ids)
        if not ids:
            return set()
        return self._run(lambda c: {r[0] for r in self._execute(c, QUERIES["waiting_ids"], {"ids": ids})})

    # -- firer -----------------------------------------------------------------------------

    def claim(self, limit: int, lookahead_ms: int, window_ms: int | None = None) -> list[Claimed]:
        params = {"node": self.node_id, "limit": limit, "lookahead_ms": lookahead_ms, "window_ms": window_ms}
        statement = QUERIES["claim" if window_ms is None else "claim_recent"]

        def run(conn: psycopg.Connection) -> list[Claimed]:
            cur = self._execute(conn, statement, params, prepare=True)
            rows = [Claimed(*r) for r in cur.fetchall()]
            rows.sort(key=lambda r: (r.scheduled_us, r.seq))  # RETURNING has no order of its own
            return rows
        return self._run(run)

    def claim_limited(self, limits: ratelimit.FireRateLimits, output_topic: str, limit: int,
                      lookahead_ms: int) -> tuple[list[Claimed], bool]:
        """The claim when fire-rate limits are configured: topic by topic, each off its own index so
        a throttled backlog never delays another topic. A limited topic's rows are claimed once due
        (no lookahead: a token is spent when its message may go out) and no more of them than its
        bucket holds, taken in the claim's own transaction under the bucket's lock, so all firers
        together keep to the rate. Returns (rows in deadline order, whether a topic's share of the
        batch rather than its budget or its due rows ended its claim: a backlog to drain without
        sleeping)."""
        topics = self._run(lambda c: [r[0] for r in self._execute(c, QUERIES["waiting_topics"], prepare=True)])
        # One _run per topic: a transaction run again after a rollback repeats only its own topic.
        return ratelimit.claim_by_topic(
            limits, output_topic, topics, limit,
            lambda topic, share: self._run(lambda c: self._claim_topic(c, topic, share, lookahead_ms)),
            lambda name, topic, rate, share: self._run(lambda c: self._claim_granted(c, name, topic, rate, share)))

    def _claim_granted(self, conn: psycopg.Connection, name: str, topic: str | None, rate: float,
                       limit: int) -> list[Claimed]:
        """Claim as many due rows of one limited topic as its bucket allows, in one transaction."""
        with self._transaction(conn):
            bucket = self._execute(conn, QUERIES["take_output_tokens" if topic is None else "take_tokens"], {
                "topic": name, "rate": rate, "capacity": ratelimit.capacity(rate)}, prepare=True).fetchone()
            if bucket is None:  # nothing due
                return []
            grant = min(int(bucket[0]), limit)
            rows = self._claim_topic(conn, topic, grant, 0) if grant > 0 else []
            if rows:
                conn.execute(QUERIES["spend_tokens"], {"topic": name, "spent": len(rows)})
        return rows

    def _claim_topic(self, conn: psycopg.Connection, topic: str | None, limit: int,
                     lookahead_ms: int) -> list[Claimed]:
        query = QUERIES["claim_output_topic" if topic is None else "claim_topic"]
        params = {"node": self.node_id, "limit": limit, "lookahead_ms": lookahead_ms, "topic": topic}
        return [Claimed(*r) for r in self._execute(conn, query, params, prepare=True).fetchall()]

    def throttled(self, output_topic: str) -> list["Throttled"]:
        """Per topic the firers limit (their buckets in chronos_rate_limits): how many rows are due
        and not claimed, held back by the limit (at most DUE_CAP counted), and how late the oldest
        of them is, by the database clock."""
        def run(conn: psycopg.Connection) -> list[Throttled]:
            at = one(self._execute(conn, QUERIES["db_now"]))[0]
            found = []
            for topic, rate in self._execute(conn, QUERIES["limited_topics"]).fetchall():
                output = topic == output_topic
                rows, oldest = one(self._execute(conn, QUERIES["throttled_output_topic" if output else "throttled_topic"],
                                                  {"topic": topic, "cap": DUE_CAP}))
                found.append(Throttled(topic, rate, rows, max(0.0, (at - oldest).total_seconds()) if oldest else 0.0))
            return found
        return self._run(run)

    def claim_schedules(self, limit: int, lookahead_ms: int, now_us: int) -> list[Claimed]:
        """Fire due recurring schedules: in one transaction per call, create each due occurrence
        as a row claimed by this node and move the schedule to its next occurrence, so that with
        several firers, restarts and kills no occurrence is skipped or created twice.

        A schedule replaced after its occurrence was created (within the lookahead) is due again
        at that same time: that occurrence is not created again (the old version's stays the
        only one), the replacement applies from the next occurrence after it."""
        def run(conn: psycopg.Connection) -> list[Claimed]:
            claimed: list[Claimed] = []
            with self._transaction(conn):
                due = conn.execute(QUERIES["due_schedules"], {"limit": limit, "lookahead_ms": lookahead_ms})
                for (sid, deadline_us, expr, tz, topic, key, value, headers, okey, last_us, dst) in due.fetchall():
                    try:
                        step = schedules.step(sid, deadline_us, expr, tz, dst, headers, last_us, now_us)
                    except cron.CronError as exc:
                        log.error("recurring schedule %s has a bad expression (%s); cancelling it", sid, exc)
                        conn.execute(QUERIES["cancel"], {"ids": [sid]})
                        continue
                    occ = step.occurrence
                    if occ is not None:
                        row = conn.execute(QUERIES["insert_occurrence"], {
                            "id": occ.id, "deadline_us": occ.deadline_us, "topic": topic, "key": key,
                            "value": value, "headers": occ.headers, "ordering_key": okey,
                            "node": self.node_id}).fetchone()
                        if row is not None:
                            claimed.append(Claimed(*row))
                    conn.execute(QUERIES["advance_schedule"], {"id": sid, "next_us": step.next_us,
                                                               "last_us": occ.deadline_us if occ else None})
            return claimed
        return self._run(run)

    def delete_fired(self, done: Sequence[Claimed]) -> int:
        """Delete exactly these rows if this node still owns them as claimed; returns how many."""
        if not done:
            return 0
        params = _claimed_params(done, self.node_id)
        return self._run(lambda c: self._execute(c, QUERIES["delete_fired"], params, prepare=True).rowcount)

    def release(self, rows: Sequence[Claimed]) -> int:
        """Hand claimed rows back (unpublished, or their publish failed) so any firer takes them."""
        if not rows:
            return 0
        params = _claimed_params(rows, self.node_id)
        return self._run(lambda c: self._execute(c, QUERIES["release"], params).rowcount)

    def retry_later(self, failed: Sequence[tuple[Claimed, str, int]]) -> int:
        """Hand back rows whose publish was refused, each (row, error, delay_ms): the failure is
        counted and the row waits out its delay before any firer claims it again. Returns how many
        rows were still this node's."""
        if not failed:
            return 0
        params = _claimed_params([r for r, _, _ in failed], self.node_id)
        params.update(errors=[e for _, e, _ in failed], delay_ms=[d for _, _, d in failed])
        return self._run(lambda c: self._execute(c, QUERIES["retry_later"], params).rowcount)

    def park_claimed(self, rows: Sequence[tuple[Claimed, str]], output_topic: str) -> int:
        """Move claimed rows, each (row, reason), from the store to chronos_parked in one statement.
        Returns how many were still this node's (and so moved)."""
        if not rows:
            return 0
        params = _claimed_params([r for r, _ in rows], self.node_id)
        params.update(reasons=[reason for _, reason in rows], output_topic=output_topic)
        return self._run(lambda c: self._execute(c, QUERIES["park_claimed"], params).rowcount)

    def park(self, messages: Sequence[Parked]) -> None:
        """Keep messages no topic accepted, in one transaction."""
        if not messages:
            return

        def run(conn: psycopg.Connection) -> None:
            with self._transaction(conn), conn.cursor() as cur:
                cur.executemany(QUERIES["park_message"], [
                    {"message_id": m.message_id, "source": m.source, "topic": m.topic, "deadline": m.deadline,
                     "key": m.key, "value": m.value, "headers": m.headers, "reason": m.reason} for m in messages])
        self._run(run)

    def db_clock_us(self) -> int:
        return self._run(lambda c: one(self._execute(c, QUERIES["db_clock"]))[0])

    # -- detector --------------------------------------------------------------------------

    def find_stale(self, hold_ms: int, limit: int = 10000) -> list[Stale]:
        return self._run(lambda c: [Stale(*r) for r in
                                    self._execute(c, QUERIES["find_stale"], {"hold_ms": hold_ms, "limit": limit})])

    def reset_stale(self, seen: Sequence[Stale]) -> list[uuid.UUID]:
        """Reset the rows whose readied_at/readied_by are still what the detector saw."""
        if not seen:
            return []
        params = {"ctids": text_array(s.ctid for s in seen), "ids": [s.id for s in seen],
                  "readied_at": [s.readied_at for s in seen], "readied_by": [s.readied_by for s in seen]}
        return self._run(lambda c: [r[0] for r in self._execute(c, QUERIES["reset_stale"], params)])

    # -- status and metrics ----------------------------------------------------------------

    def overview(self, hold_ms: int, *, exact: bool | None = None) -> "Overview":
        """What `chronos status` and the detector's gauges show, from cheap index-backed queries.

        The waiting count is exact below ESTIMATE_ABOVE rows (or with exact=True), else the
        planner's estimate; the due count stops at DUE_CAP. Tolerates schemas without recurring
        schedules (no `cron` column: a database migrated by an older chronos).
        """
        def run(conn: psycopg.Connection) -> Overview:
            execute = self._execute
            has_cron, estimate = one(execute(conn, QUERIES["overview_features"]))
            nodes = [NodeLoad(*r) for r in execute(conn, QUERIES["overview_in_flight"], {"hold_ms": hold_ms})]
            count = exact if exact is not None else estimate < ESTIMATE_ABOVE
            at, first, next_deadline, waiting, due = one(execute(
                conn, QUERIES["overview_waiting_cron" if has_cron else "overview_waiting"],
                {"exact": count, "due_cap": DUE_CAP}))
            schedules = one(execute(conn, QUERIES["count_cron_schedules"]))[0] if has_cron else None
            parked = None
            if one(execute(conn, QUERIES["has_parked"]))[0]:
                parked = one(execute(conn, QUERIES["count_parked"]))[0]
            return Overview.build(at, first, next_deadline, waiting, estimate, due, nodes, schedules, parked)
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


    # -- operators -------------------------------------------------------------------------

    def show(self, message_id: str, *, output_topic: str) -> Message | None:
        row = self._run(lambda c: c.execute(QUERIES["show_message"], {"id": message_id, "preview": PREVIEW_BYTES})
                        .fetchone())
        if row is None:
            return None
        (mid, deadline, readied_at, readied_by, topic, key, size, preview, headers, okey, enqueued_at, expr, tz,
         dst, attempts, last_error, original_deadline) = row
        return Message(id=mid, state=state_of(expr, readied_at is not None), deadline=deadline,
                       topic=topic or output_topic, key=key, headers=codec.decode_headers(headers) if headers else [],
                       value_size=size, value_preview=b"" if preview is None else bytes(preview),
                       ordering_key=okey, enqueued_at=enqueued_at, firer=readied_by, claimed_at=readied_at,
                       cron=expr, timezone=(tz or "UTC") if expr is not None else None, dst_policy=dst,
                       attempts=attempts, last_error=last_error, original_deadline=original_deadline)

    def list_messages(self, f: Filters, *, output_topic: str, limit: int, after: Position | None = None,
                      not_at: datetime | None = None) -> list[Listed]:
        params = list_params(f, limit, after=after, not_at=not_at)
        # prepare=False: planned for these values every time (see list_by_deadline)
        rows = self._run(lambda c: c.execute(QUERIES["list_by_deadline" if f.id_prefix is None else "list_by_id"],
                                             params, prepare=False).fetchall())
        return [Listed(state=s, id=i, deadline=d, seq=q, topic=t or output_topic, key=k, ordering_key=o, firer=r,
                       cron=cr) for s, i, d, q, t, k, o, r, cr in rows]

    def list_parked(self, *, limit: int, before: int | None = None) -> list[ParkedMessage]:
        rows = self._run(lambda c: c.execute(QUERIES["list_parked"], {"before": before, "limit": limit,
                                                                      "preview": PREVIEW_BYTES}).fetchall())
        return [ParkedMessage(number=n, message_id=mid, source=src, topic=topic, deadline=deadline, key=key,
                              headers=codec.decode_headers(headers) if headers else [], value_size=size,
                              value_preview=b"" if preview is None else bytes(preview), reason=reason, parked_at=at)
                for n, mid, src, topic, deadline, key, size, preview, headers, reason, at in rows]

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


def role_store(settings: Settings, node_id: uuid.UUID, role: str, *, synchronous_commit: bool = True) -> Store:
    """A process's own store: the hot path's planner settings, CHRONOS_DATABASE_TIMEOUT_MS as the deadline
    of every call, an application name that says which process it is (`pg_stat_activity`, `chronos
    status`), and CHRONOS_DATABASE_POOL_MODE (settled at the process's start: chronos.runtime.process)."""
    return Store(settings.require_database(), node_id=node_id, hot_path=True, synchronous_commit=synchronous_commit,
                 deadline_s=settings.database_timeout_ms / 1000.0, application_name=application_name(role, node_id),
                 pool_mode=settings.database_pool_mode)


def application_name(role: str, node_id: uuid.UUID) -> str:
    """`chronos <role> <node id>`: how a process's sessions show in pg_stat_activity."""
    return f"chronos {role} {node_id}"


# held to the ports by the type checker: a method the roles or the operators call that this store lacks fails `mypy`
_PORT: type[ports.Store] = Store
_OPERATORS_PORT: type[ports.OperatorsStore] = Store
