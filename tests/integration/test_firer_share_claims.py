"""A firer's claim of its own slices visits only its own rows in the table: the plan PostgreSQL ran, with the
rows each of its nodes really read (EXPLAIN ANALYZE, rolled back)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from chronos.adapters.postgres.queries import QUERIES
from chronos.domain.shares import slice_span, slices_of


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


@pytest.mark.parametrize("analyzed", ["with_its_rows", "before_the_due_rows"])
def test_a_claim_of_its_own_slices_reads_only_its_own_due_rows(database_url, analyzed):
    """The slice is the due index's last column: the claim's range of it passes over the other firers' rows
    in the index, and fetches from the table only its own. Also when the table was last analyzed before the
    due rows came (a quiet hour, then a burst; or any young table, whose deadlines move on past its
    statistics)."""
    me, peer = uuid.uuid4(), uuid.uuid4()
    mine = slices_of(me, [peer])
    assert mine is not None
    low, high, mask = slice_span(mine)
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
                {"node": me, "low": low, "high": high, "mask": mask, "limit": 4000,  # more than its due rows
                 "lookahead_ms": 300}).fetchall()
    plan = explained[0]["Plan"]
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "chronos_messages"
             and n.get("Index Name") == "chronos_messages_due_sliced"]
    assert scans, json.dumps(plan, indent=1)
    # the scan fetched exactly this firer's due rows: no other firer's row, no far-future row, nothing
    # fetched and then filtered out
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in scans)
    assert read == own and not any(n.get("Rows Removed by Filter") for n in scans)
    assert plan["Node Type"] == "ModifyTable" and plan["Actual Rows"] == own  # and claimed every one
