"""A firer's claim of its own slices reads only its own rows: the plan PostgreSQL ran, with the rows each
of its nodes really read (EXPLAIN ANALYZE, rolled back)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from chronos.adapters.postgres.queries import QUERIES
from chronos.domain.shares import slice_limits, slices_of


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


@pytest.mark.parametrize("analyzed", ["with_its_rows", "before_the_due_rows"])
def test_a_claim_of_its_own_slices_reads_only_its_own_due_rows(database_url, analyzed):
    """Also when the table was last analyzed before the due rows came (a quiet hour, then a burst; or any
    young table, whose deadlines move on past its statistics): the planner, told that hardly any row is
    due, took the due index and filtered every firer's due rows by slice, while the share index was
    there (four firers fetched six rows for every one they claimed)."""
    me, peer = uuid.uuid4(), uuid.uuid4()
    mine = slices_of(me, [peer])
    assert mine is not None
    kept, limits = slice_limits(mine, 4000)  # more than its due rows: every one is read
    with psycopg.connect(database_url, autocommit=True) as conn:
        # far-future rows, and 4,000 due ones (every tenth with an ordering key shared by four)
        conn.execute("INSERT INTO chronos_messages (id, deadline) "
                     "SELECT 'f' || g, now() + interval '1 day' FROM generate_series(1, 4000) g")
        if analyzed == "before_the_due_rows":
            conn.execute("ANALYZE chronos_messages")
        conn.execute("INSERT INTO chronos_messages (id, deadline, ordering_key) "
                     "SELECT 'm' || g, now() - interval '1 minute' + g * interval '1 millisecond', "
                     "       CASE WHEN g % 10 = 0 THEN 'key-' || (g / 40) END FROM generate_series(1, 4000) g")
        if analyzed == "with_its_rows":
            conn.execute("ANALYZE chronos_messages")
        own = conn.execute("SELECT count(*) FROM chronos_messages WHERE deadline < now() "
                           "AND (hashtext(coalesce(ordering_key, id)) & 15) = ANY(%s)", (list(mine),)).fetchone()[0]
        assert 1500 < own < 2500  # about half the due rows are this firer's
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL enable_seqscan = off")
            conn.execute("SET LOCAL enable_bitmapscan = off")
            [(explained,)] = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["claim_share"],
                {"node": me, "slices": kept, "limits": limits, "lookahead_ms": 300}).fetchall()
    plan = explained[0]["Plan"]
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "chronos_messages"
             and n.get("Index Name") == "chronos_messages_due_share"]
    assert scans, json.dumps(plan, indent=1)
    # each slice's scan, once per slice, read exactly that slice's due rows: no other firer's row,
    # no far-future row, nothing filtered out
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in scans)
    assert read == own and not any(n.get("Rows Removed by Filter") for n in scans)
    assert plan["Node Type"] == "ModifyTable" and plan["Actual Rows"] == own  # and claimed every one
