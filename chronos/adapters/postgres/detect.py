"""The detector's statements on PostgreSQL (`ports.DetectStore`): rows held past the hold time found and
handed back, and the gauges (`overview`, also `chronos status`'s; `throttled`). Run on the store's session
(`session.Session`)."""

from __future__ import annotations

import uuid
from typing import Sequence

import psycopg

from chronos.adapters.postgres.arrays import text_array
from chronos.adapters.postgres.connection import one
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.session import Session
from chronos.domain.model import DUE_CAP, ESTIMATE_ABOVE, NodeLoad, Overview, Stale, Throttled


def merge_held(stamped: list[NodeLoad], held: list[NodeLoad]) -> list[NodeLoad]:
    """The rows in flight per firer: those stamped as claimed and those held by its claims that delete (a firer
    has one kind or the other, but a row may be in both lists for an instant), most rows first."""
    by_node = {n.node: n for n in stamped}
    for h in held:
        n = by_node.get(h.node)
        by_node[h.node] = h if n is None else NodeLoad(
            n.node, n.rows + h.rows, n.past_hold_time + h.past_hold_time, max(n.held_for_s, h.held_for_s),
            min(n.oldest_deadline, h.oldest_deadline))
    return sorted(by_node.values(), key=lambda n: (-n.rows, str(n.node)))


class DetectStatements(Session):
    """The detector's side of the store."""

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

    def overview(self, hold_ms: int, *, exact: bool | None = None) -> "Overview":
        """What `chronos status` and the detector's gauges show, from cheap index-backed queries.

        The waiting count is exact below ESTIMATE_ABOVE rows (or with exact=True), else the
        planner's estimate; the due count stops at DUE_CAP. Rows held by firers' claims that delete
        (`overview_held`) are in flight, per firer, and counted neither waiting nor due. Tolerates
        schemas without recurring schedules (no `cron` column: a database migrated by an older chronos).
        """
        def run(conn: psycopg.Connection) -> Overview:
            execute = self._execute
            has_cron, estimate = one(execute(conn, QUERIES["overview_features"]))
            nodes = [NodeLoad(*r) for r in execute(conn, QUERIES["overview_in_flight"], {"hold_ms": hold_ms})]
            count = exact if exact is not None else estimate < ESTIMATE_ABOVE
            at, first, next_deadline, waiting, due = one(execute(
                conn, QUERIES["overview_waiting_cron" if has_cron else "overview_waiting"],
                {"exact": count, "due_cap": DUE_CAP}))
            if has_cron:  # a schema that has recurring schedules has the columns the claim that deletes needs
                held = execute(conn, QUERIES["overview_held"], {"hold_ms": hold_ms, "within_ms": hold_ms // 2,
                                                                "cap": DUE_CAP}).fetchall()
                nodes = merge_held(nodes, [NodeLoad(*r[:5]) for r in held])
                waiting = None if waiting is None else waiting - sum(r[1] for r in held)
                due = max(0, due - sum(r[5] for r in held))
            schedules = one(execute(conn, QUERIES["count_cron_schedules"]))[0] if has_cron else None
            parked = None
            if one(execute(conn, QUERIES["has_parked"]))[0]:
                parked = one(execute(conn, QUERIES["count_parked"]))[0]
            return Overview.build(at, first, next_deadline, waiting, estimate, due, nodes, schedules, parked)
        return self._run(run)

    def gauge_reader(self, within_ms: int) -> uuid.UUID | None:
        """`ports.DetectStore.gauge_reader`."""
        def run(conn: psycopg.Connection) -> uuid.UUID | None:
            if one(self._execute(conn, QUERIES["has_processes"]))[0] is None:
                return None  # a schema before version 10: no detector says where it serves
            first = self._execute(conn, QUERIES["gauge_reader"], {"within_ms": within_ms}).fetchone()
            return None if first is None else first[0]
        return self._run(run)

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
