"""Every hot-path statement costs in proportion to the rows it touches, whatever the statistics say.

Each test puts the table in one state that has misled the planner (analyzed while empty and then
grown; ten million rows; bloated by a million deleted rows), runs every statement of the
consumer, the firer and the detector through `Store` as the processes do (their connection
settings, psycopg's prepared statements, more than five executions so PostgreSQL may switch to
a generic plan) under a forced generic or custom plan, and reads each plan PostgreSQL really
ran from auto_explain. A plan fails if it reads `chronos_messages` other than through an index
condition or a TID, or rescans a whole input once per row of another (a nested loop's inner
side, a correlated subplan): the shapes that made a claim of 2,000 rows take 76 s; or if PostgreSQL
compiled it with JIT, 100 to 300 ms of a statement that takes one.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.store import Store
from chronos.adapters.postgres.takes import TakeStatements
from chronos.domain.model import Claimed, Mark, Row, Stale
from chronos.domain.ratelimit import FireRateLimits, TopicRates

TABLE = "chronos_messages"
HOT_PATH = ("claim", "due_schedules", "insert_occurrence", "advance_schedule", "delete_fired", "release",
            "find_stale", "reset_stale", "insert_from_staging", "upsert_from_staging", "cancel", "waiting_ids",
            # the claim under fire-rate limits: topic by topic, each limited one within its bucket
            "waiting_topics", "claim_topic", "claim_output_topic", "take_tokens", "take_output_tokens",
            # beside other firers: the lease, and the claim of the firer's own slices
            "firer_heartbeat", "claim_share", "claim_share_recent", "claim_share_after",
            # the claim that deletes: each claim's pick, and the take by TID
            "pick", "pick_share", "pick_share_recent", "pick_share_after", "pick_topic", "pick_output_topic", "take",
            # a firer alone's claims after one that came back full: each starts where the last one ended
            "pick_after", "claim_after")
OUTPUT = "chronos.out"
LIMITS = FireRateLimits(TopicRates(((OUTPUT, 1e6), ("limited.topic", 1e6))))
# scans that read only what an index condition or a TID bounds
BOUNDED = {"Index Scan", "Index Only Scan", "Tid Scan"}
# nodes that go through a whole input every time they run
WHOLE = {"Seq Scan", "Bitmap Heap Scan", "CTE Scan", "Function Scan", "Subquery Scan", "Materialize",
         "WorkTable Scan", "Values Scan", "Sort", "Hash", "Aggregate", "WindowAgg"}


def now_us() -> int:
    return time.time_ns() // 1000


def converted(sql: str) -> str:
    """The statement as psycopg sends it: %(name)s placeholders numbered by first appearance."""
    names: dict[str, int] = {}
    return re.sub(r"%\((\w+)\)s", lambda m: f"${names.setdefault(m.group(1), len(names) + 1)}", sql)


STATEMENT_OF = {converted(QUERIES[name]).strip(): name for name in HOT_PATH}


@dataclass
class PlanLog:
    """The plan of every statement the store's connection runs, as auto_explain reports it."""

    store: Store
    plans: list[tuple[str, dict]] = field(default_factory=list)
    compiled: list[str] = field(default_factory=list)  # the statements PostgreSQL compiled with JIT

    def attach(self, mode: str) -> None:
        conn = self.store.conn
        assert conn is not None
        conn.execute("LOAD 'auto_explain'")
        for name, value in (("log_min_duration", "0"), ("log_format", "json"), ("log_level", "notice")):
            conn.execute(f"SET auto_explain.{name} = '{value}'")
        conn.execute(f"SET plan_cache_mode = {mode}")
        conn.add_notice_handler(self._notice)

    def _notice(self, diag) -> None:
        text = diag.message_primary or ""
        if "plan:" not in text:
            return
        plan = json.loads(text.split("plan:", 1)[1])
        name = STATEMENT_OF.get(plan["Query Text"].strip())
        if name is not None:
            self.plans.append((name, plan["Plan"]))
            if "JIT" in plan:
                self.compiled.append(name)


def violations(node: dict, repeated: bool = False, path: str = "", parent: str = "") -> list[str]:
    """What in this plan reads more than the rows the statement touches. An index scan without a
    condition under a Limit and without a filter reads only the rows the Limit takes (the first
    step of `waiting_topics`' skip scan: the first entry of a partial index). A nested loop over a
    function scan (the hot path's functions are `unnest`s of array parameters: a take's TIDs)
    runs its inner side once per element the caller passed, not per row of the table: that side is
    checked as a plan of its own."""
    kind, found = node["Node Type"], []
    where = f"{path}/{kind}" + (f" on {node['Relation Name']}" if node.get("Relation Name") else "")
    if node.get("Relation Name") == TABLE and kind.endswith("Scan"):
        if kind not in BOUNDED:
            found.append(f"{where}: reads the table without an index condition or TID")
        elif kind != "Tid Scan" and "Index Cond" not in node and not (parent == "Limit" and "Filter" not in node):
            found.append(f"{where}: a whole index, without an index condition")
    if repeated and kind in WHOLE:
        found.append(f"{where}: runs in full once per outer row")
    children = node.get("Plans", [])
    per_element = kind == "Nested Loop" and any(
        c.get("Parent Relationship") == "Outer" and c["Node Type"] == "Function Scan" for c in children)
    for child in children:
        relation = child.get("Parent Relationship")
        again = repeated or relation == "SubPlan" or (kind == "Nested Loop" and relation == "Inner" and not per_element)
        found += violations(child, again, where, kind)
    return found


# -- the table states ------------------------------------------------------------------------------

def fill(conn, n: int, prefix: str, *, due: bool = True, keyed: bool = True) -> None:
    """n rows: due ones (deadline in the past) or far-future ones; if keyed, every tenth row has an
    ordering key shared with three others."""
    conn.execute(
        f"INSERT INTO {TABLE} (id, deadline, key, value, headers, ordering_key) "
        "SELECT %(p)s || g, now() + CASE WHEN %(due)s THEN -interval '1 minute' ELSE interval '1 year' END "
        "       + g * interval '1 microsecond', ('k' || g)::bytea, repeat('v', 100)::bytea, ''::bytea, "
        "       CASE WHEN %(keyed)s AND g %% 10 = 0 THEN %(p)s || 'key-' || (g / 40) END "
        "FROM generate_series(1, %(n)s) AS g", {"p": prefix, "due": due, "keyed": keyed, "n": n})


def forge(conn, tuples: float) -> None:
    """Make the planner believe the table and its indexes hold `tuples` rows: it scales reltuples
    by the relation's current size over relpages, so relpages is set to the current size."""
    for (rel,) in conn.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass "
                               "UNION ALL SELECT %s", (TABLE, TABLE)).fetchall():
        pages = max(1, conn.execute("SELECT pg_relation_size(%s) / 8192", (rel,)).fetchone()[0])
        conn.execute("SELECT pg_restore_relation_stats('schemaname', 'public', 'relname', %s::text, "
                     "'relpages', %s::integer, 'reltuples', %s::real)", (rel, pages, tuples))
    estimate = conn.execute(f"EXPLAIN (FORMAT JSON) SELECT * FROM {TABLE}").fetchone()[0][0]["Plan"]["Plan Rows"]
    assert estimate >= tuples * 0.9, estimate


def analyzed_empty_then_grown(conn, phase: str) -> None:
    """The state after a drain: ANALYZE saw an empty table (plans are made and cached then), and
    100,000 rows arrived since."""
    if phase == "before":
        conn.execute(f"ANALYZE {TABLE}")
    else:
        fill(conn, 100_000, "grown-")


def ten_million(conn, phase: str) -> None:
    if phase == "before":
        fill(conn, 3000, "far-", due=False)
        forge(conn, 10_000_000)
    else:
        fill(conn, 3000, "due-")


def fill_then_index(conn, n: int, prefix: str, **kw: bool) -> None:
    """`fill`, with the table's indexes built once the rows are in (from their definitions, the primary key's
    constraint too) rather than kept row by row: the same rows and index entries, in a third of the time."""
    with conn.transaction():
        indexes = conn.execute("SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), c.conname "
                               "FROM pg_index AS i LEFT JOIN pg_constraint AS c ON c.conindid = i.indexrelid AND c.contype = 'p' "
                               "WHERE i.indrelid = %s::regclass", (TABLE,)).fetchall()
        for name, _, constraint in indexes:
            conn.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {constraint}" if constraint else f"DROP INDEX {name}")
        fill(conn, n, prefix, **kw)
        for name, definition, constraint in indexes:
            conn.execute(definition)
            if constraint:
                conn.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {constraint} PRIMARY KEY USING INDEX {name}")


def bloated(conn, phase: str) -> None:
    """A million rows fired and deleted, not vacuumed away (in the table and in every index); ANALYZE saw the
    live few."""
    if phase == "before":
        fill_then_index(conn, 1_000_000, "gone-", keyed=False)
        conn.execute(f"DELETE FROM {TABLE}")
        conn.execute(f"ANALYZE {TABLE}")
    else:
        fill(conn, 20_000, "live-")


CONDITIONS = {"analyzed_empty_then_grown": analyzed_empty_then_grown, "ten_million_rows": ten_million,
              "bloated_by_a_million_deleted_rows": bloated}


# -- the statements ---------------------------------------------------------------------------------

def exercise(admin, firer: Store, consumer: Store, detector: Store, takes: TakeStatements, *, times: int) -> None:
    """Run every hot-path statement `times` times as the processes do (a firer that claims with a delete:
    `takes`)."""
    t = now_us()
    for _ in range(times):
        tag = uuid.uuid4().hex[:8]
        admin.execute(f"INSERT INTO {TABLE} (id, deadline, topic) SELECT %s || g, now() - interval '1 second', "
                      "CASE WHEN g %% 2 = 0 THEN 'limited.topic' ELSE 'free.topic' END FROM generate_series(1, 40) g",
                      (f"taken-{tag}-",))
        # each batch given back at once: the rows back for the next claim (a batch's own claims see its rows
        # gone), and for the other claims below
        takes.claim(500, 300)
        takes.give_back()
        mark = Mark(t - 500_000, 0, firer.last_seq() - 20)  # rows past the mark, and below it the newest
        takes.claim(500, 300, 2000, mark)
        takes.give_back()
        firer.delete_fired(firer.claim(10, 300, 2000, mark))
        for window in (None, 2000):
            takes.claim_share(tuple(range(1, 16, 2)), 500, 300, window)
            takes.give_back()
        takes.claim_share(tuple(range(8, 16)), 500, 300, 2000, mark)
        takes.give_back()
        takes.claim_limited(LIMITS, OUTPUT, 200, 300, firer)
        takes.give_back()
        claimed = firer.claim(2000, 300)
        firer.firer_heartbeat(5000)
        for window in (None, 2000):
            shared, _ = firer.claim_share(tuple(range(0, 16, 2)), 2000, 300, window)
            firer.delete_fired(shared)
        firer.delete_fired(firer.claim_share(tuple(range(0, 8)), 10, 300, 2000, mark)[0])
        firer.delete_fired(claimed[: len(claimed) // 2])
        firer.release(claimed[len(claimed) // 2:]
                      or [Claimed("none", t, None, None, None, b"", t_dt(admin), ctid="(0,1)")])
        admin.execute(f"INSERT INTO {TABLE} (id, deadline, cron) VALUES (%s, now() - interval '1 second', "
                      "'* * * * *')", (f"cron-{tag}",))
        admin.execute(f"INSERT INTO {TABLE} (id, deadline, topic) SELECT %s || g, now() - interval '1 second', "
                      "CASE WHEN g %% 2 = 0 THEN 'limited.topic' ELSE 'free.topic' END FROM generate_series(1, 40) g",
                      (f"topic-{tag}-",))
        limited, _ = firer.claim_limited(LIMITS, OUTPUT, 500, 300)
        firer.delete_fired(limited)
        occurrences = firer.claim_schedules(100, 300, now_us())
        firer.delete_fired(occurrences)
        # rows a dead firer holds, past the hold time
        admin.execute(f"INSERT INTO {TABLE} (id, deadline, readied_at, readied_by) "
                      "SELECT %s || g, now(), now() - interval '1 hour', %s FROM generate_series(1, 50) g",
                      (f"stale-{tag}-", uuid.uuid4()))
        stale = detector.find_stale(5000)
        assert detector.reset_stale(stale or [Stale("none", t_dt(admin), uuid.uuid4(), ctid="(0,1)")]) is not None
        inserts = [Row(f"in-{tag}-{j}", t + 60_000_000 + j, None, b"k", b"v", b"") for j in range(200)]
        replaces = [Row(f"in-{tag}-{j}", t + 90_000_000, None, b"k", b"w", b"") for j in range(50)]
        consumer.apply(inserts, replaces, [f"in-{tag}-{j}" for j in range(50, 100)])
        # a batch read again (ids already waiting): the inserts go through the staging table
        consumer.apply(inserts[150:] + [Row(f"again-{tag}-{j}", t + j, None, b"k", b"v", b"") for j in range(50)],
                       [], [])
        consumer.waiting_ids([f"in-{tag}-{j}" for j in range(0, 400, 2)])


def take_session(url: str) -> TakeStatements:
    node = uuid.uuid4()
    return TakeStatements(url, node_id=node, hot_path=True, held_ms=60_000, application_name=f"chronos firer {node}")


def t_dt(admin):
    return admin.execute("SELECT now()").fetchone()[0]


@pytest.mark.parametrize("condition", list(CONDITIONS))
def test_every_hot_path_statement_reads_only_what_it_touches(database_url, condition):
    """Under each condition, generic and custom plans (each through three stores of their own, as
    the firer, the consumer and the detector)."""
    setup = CONDITIONS[condition]
    modes = ("force_generic_plan", "force_custom_plan")
    with psycopg.connect(database_url, autocommit=True) as admin:
        # only the statistics this test sets: no autovacuum or autoanalyze in between
        admin.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
        setup(admin, "before")
        stores: dict[str, list[Any]] = {mode: [Store(database_url, node_id=uuid.uuid4(), hot_path=True)
                                               for _ in range(3)] + [take_session(database_url)] for mode in modes}
        logs: dict[str, list[PlanLog]] = {mode: [] for mode in modes}
        for mode in modes:
            for st in stores[mode]:
                st.open()
                log = PlanLog(st)
                log.attach(mode)
                logs[mode].append(log)
        # more than five executions of each, made and cached in this state
        for mode in modes:
            exercise(admin, *stores[mode], times=6)
        setup(admin, "after")
        for mode in modes:
            for log in logs[mode]:
                log.plans.clear()
            exercise(admin, *stores[mode], times=2)
            for st in stores[mode]:
                st.close()
    bad = []
    for mode in modes:
        plans = [p for log in logs[mode] for p in log.plans]
        assert {name for name, _ in plans} == set(HOT_PATH), mode
        bad += [f"{mode} {name}: {'; '.join(v)}" for name, plan in plans if (v := violations(plan))]
        # a disabled scan adds 10^10 to a plan's cost before PostgreSQL 18, past every JIT threshold: compiling
        # took 100 to 300 ms of each execution of a statement that takes one
        bad += [f"{mode} {name}: compiled with JIT" for log in logs[mode] for name in log.compiled]
    assert not bad, "\n".join(dict.fromkeys(bad))
